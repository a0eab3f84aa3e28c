package main

import (
	"io"
	"strings"
	"testing"

	srvmodel "kvtier.dev/examples/server/internal/model"
	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/cost"
)

// TestServeCodec: with -host-codec fp8-e4m3 (the NVMe tier following it)
// the startup log names the tiers' codecs, and a prompt whose blocks other
// prompts pushed off the GPU tier comes back from the lower tiers, decoded,
// as cached tokens.
func TestServeCodec(t *testing.T) {
	s := start(t, testArgs("-host-codec", "fp8-e4m3")...)
	for _, want := range []string{"host_codec=fp8-e4m3-per-head", "nvme_codec=fp8-e4m3-per-head", "remote_codec=none"} {
		if !strings.Contains(s.logs.String(), want) {
			t.Fatalf("the startup log does not say %s:\n%s", want, s.logs)
		}
	}
	p := tokenPrompt(1, 41)
	first := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4)})
	for i := 2; i < 6; i++ { // 40 more blocks: past the GPU tier (32), within the host tier (64)
		s.complete(t, openai.CompletionRequest{Prompt: tokenPrompt(i, 41), MaxTokens: maxTokens(1)})
	}
	again := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4)})
	if len(first.Tokens) != 4 || len(again.Tokens) != 4 {
		t.Fatalf("tokens %v, then %v; want 4 each", first.Tokens, again.Tokens)
	}
	if c := again.Usage.PromptTokensDetails.CachedTokens; c != 40 {
		t.Errorf("the prompt again: %d cached tokens, want 40 (from the compressed tiers)", c)
	}
	fams := scrape(t, s.url)
	if got := counter(fams, "kvserve_loaded_tokens_total", "host") + counter(fams, "kvserve_loaded_tokens_total", "nvme"); got != 40 {
		t.Errorf("tokens loaded from the host and NVMe tiers: %v, want 40", got)
	}
	if err := s.shutdown(); err != nil {
		t.Fatalf("shutdown: %v\n%s", err, s.logs)
	}
}

// TestCodecFlags: bad codec names name the flag; the NVMe and remote
// tiers follow -host-codec, only where they exist, and a tier set apart
// from it is refused naming both flags.
func TestCodecFlags(t *testing.T) {
	for _, f := range []string{"-host-codec", "-nvme-codec", "-remote-codec"} {
		if _, err := parseArgs([]string{f, "fp4"}, io.Discard); err == nil || !strings.Contains(err.Error(), `invalid value "fp4" for flag `+f) {
			t.Errorf("%s fp4: %v, want the flag named", f, err)
		}
	}
	m := srvmodel.Tiny()
	fp8 := codec.FP8E4M3PerHead
	for _, tc := range []struct {
		args          []string
		nvme, remote  bool
		host, nv, rem codec.Codec
		err           string
	}{
		{nil, true, true, codec.None, codec.None, codec.None, ""},
		{[]string{"-host-codec", "fp8-e4m3"}, true, false, fp8, fp8, codec.None, ""},
		{[]string{"-host-codec", "fp8-e4m3-per-head"}, false, true, fp8, codec.None, fp8, ""},
		{[]string{"-host-codec", "fp8-e4m3", "-nvme-codec", "none"}, true, false, fp8, 0, 0, "-nvme-codec none with -host-codec fp8-e4m3-per-head"},
		{[]string{"-remote-codec", "fp8-e4m3"}, false, true, 0, 0, 0, "-remote-codec fp8-e4m3-per-head with -host-codec none"},
		{[]string{"-remote-codec", "fp8-e4m3"}, false, false, codec.None, codec.None, codec.None, ""},
	} {
		c, err := parseArgs(tc.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		o, err := c.codecs.options(m, tc.nvme, tc.remote)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || o.Host != tc.host || o.NVMe != tc.nv || o.Remote != tc.rem || o.KVHeads != m.KVHeads {
			t.Errorf("%v (nvme %v, remote %v): %+v, %v; want host %s, nvme %s, remote %s, %d heads", tc.args, tc.nvme, tc.remote, o, err, tc.host, tc.nv, tc.rem, m.KVHeads)
		}
	}
	// The cost model prices the lower tiers' loads as -host-codec holds them.
	for _, host := range []string{"none", "fp8-e4m3"} {
		c, err := parseArgs([]string{"-model", "llama-3.1-8b", "-host-codec", host}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		sh, err := c.shape()
		if err != nil {
			t.Fatal(err)
		}
		pc, err := plannerConfig(&c, sh)
		if err != nil {
			t.Fatal(err)
		}
		for _, tier := range []cost.Tier{cost.TierHost, cost.TierNVMe} {
			if got := pc.Paths[tier].Codec.Name; got != map[string]string{"none": "", "fp8-e4m3": "fp8-e4m3"}[host] {
				t.Errorf("-host-codec %s: the planner's path %d has codec %q", host, tier, got)
			}
		}
	}
}

// TestHostCodecAuto: -host-codec auto (the default) takes the codec the
// cost model chooses for the host link within -codec-error-budget, and
// says so in the log with its reason: FP8 for llama-3.1-8b over PCIe 5
// within the default budget; none under a budget below FP8's error, with
// no lower tier, or for a model the cost model has no preset of; a codec
// given by name is kept, and one given for the NVMe or remote tier is
// followed (the tiers share one codec).
func TestHostCodecAuto(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want codec.Codec
		log  string
	}{
		{[]string{"-model", "llama-3.1-8b"}, codec.FP8E4M3PerHead, "within the budget 0.05"},
		{[]string{"-model", "llama-3.1-8b", "-host-codec", "auto", "-codec-error-budget", "0.01"}, codec.None, "over the budget 0.01"},
		{[]string{"-model", "llama-3.1-8b", "-strategy", "gpu-only"}, codec.None, "no lower tier"},
		{[]string{"-model", "tiny"}, codec.None, "no preset of tiny"},
		{[]string{"-model", "llama-3.1-8b", "-host-codec", "none"}, codec.None, ""},
		{[]string{"-model", "llama-3.1-8b", "-nvme-codec", "none"}, codec.None, "-nvme-codec given"},
		{[]string{"-model", "tiny", "-remote-codec", "fp8-e4m3"}, codec.FP8E4M3PerHead, "-remote-codec given"},
		{[]string{"-model", "llama-3.1-8b", "-host-codec", "fp8-e4m3", "-codec-error-budget", "0"}, codec.FP8E4M3PerHead, ""},
	} {
		var log strings.Builder
		c, err := parseArgs(tc.args, &log)
		if err != nil {
			t.Fatal(err)
		}
		sh, err := c.shape()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.codecs.resolve(&c, sh); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if c.codecs.host != tc.want {
			t.Errorf("%v: host codec %s, want %s", tc.args, c.codecs.host, tc.want)
		}
		if said := strings.Contains(log.String(), "-host-codec auto"); said != (tc.log != "") || !strings.Contains(log.String(), tc.log) {
			t.Errorf("%v: the log says %q, want the choice and %q", tc.args, log.String(), tc.log)
		}
	}
	for _, b := range []string{"-0.1", "1", "NaN"} {
		if _, err := parseArgs([]string{"-codec-error-budget", b}, io.Discard); err == nil || !strings.Contains(err.Error(), "-codec-error-budget") {
			t.Errorf("-codec-error-budget %s: %v, want an error naming the flag", b, err)
		}
	}
}
