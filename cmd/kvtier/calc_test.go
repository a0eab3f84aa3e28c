package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCalcArgs(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(append([]string{"calc"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

// TestCalcSeedExercise2 is the seed chapter's exercise 2 through the CLI: a
// 70B model (80 layers, 8 KV heads × 128, bf16, 70e9 params) with 32K tokens
// over a 50 GB/s link, recomputed at 600 TFLOP/s.
func TestCalcSeedExercise2(t *testing.T) {
	// The exercise's GPU is hypothetical (600 TFLOP/s, and the 140 GB of
	// weights fit at TP 1 beside the KV): --gpu-memory says so.
	args := []string{"--model", "llama-3.1-70b", "--params", "70e9", "--tflops", "600", "--efficiency", "1",
		"--link", "pcie5-pinned", "--bandwidth", "50", "--latency", "0", "--tokens", "32768", "--tp", "1", "--gpu-memory", "200"}
	code, out, errs := runCalcArgs(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var r calcReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.KVBytesPerToken != 327680 || r.KVBytes != 10<<30 {
		t.Errorf("KV %d bytes/token, %d total", r.KVBytesPerToken, r.KVBytes)
	}
	if r.ReloadSeconds < 0.21 || r.ReloadSeconds > 0.22 {
		t.Errorf("reload %g s, want ~0.21", r.ReloadSeconds)
	}
	if r.RecomputeLinearSeconds < 7.6 || r.RecomputeLinearSeconds > 7.7 {
		t.Errorf("linear recompute %g s, want ~7.6", r.RecomputeLinearSeconds)
	}
	if r.RecomputeAttentionSeconds <= r.RecomputeLinearSeconds || r.Decision != "reload" {
		t.Errorf("attention %g s, decision %s", r.RecomputeAttentionSeconds, r.Decision)
	}
	if r.SplitRecomputeTokens+r.SplitLoadTokens != 32768 || r.SplitSeconds > r.ReloadSeconds {
		t.Errorf("split %d+%d in %g s", r.SplitRecomputeTokens, r.SplitLoadTokens, r.SplitSeconds)
	}
	if len(r.ReloadPerLink) < 10 {
		t.Errorf("reload per link: %d links", len(r.ReloadPerLink))
	}
	code, out, _ = runCalcArgs(t, append(args, "--tp", "8", "--json")...)
	if code != 0 {
		t.Fatal(code)
	}
	r = calcReport{}
	json.Unmarshal([]byte(out), &r)
	if r.RecomputeLinearSeconds < 0.9 || r.RecomputeLinearSeconds > 1.0 {
		t.Errorf("TP 8 linear recompute %g s, want ~1", r.RecomputeLinearSeconds)
	}
	if r.KVBytesPerGPU != 10<<30/8 {
		t.Errorf("TP 8 KV per GPU %d", r.KVBytesPerGPU)
	}

	code, out, _ = runCalcArgs(t, args...)
	if code != 0 {
		t.Fatal(code)
	}
	for _, want := range []string{
		"327,680 bytes/token",
		"10.00 GiB",
		"pcie5-pinned          55.3 GB/s",
		"linear only (2 × active params × tokens)",
		"       7.65s\n",
		"with causal attention (used for decisions)",
		"decision   reload: 214.7ms",
		"best split recompute the first",
		"break-even reload wins from",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
}

func TestCalcParamsOverride(t *testing.T) {
	for _, c := range []struct {
		args          []string
		total, active float64
	}{
		{[]string{"--model", "llama-3.1-8b", "--params", "9e9"}, 9e9, 9e9},
		{[]string{"--model", "mixtral-8x7b", "--params", "50e9"}, 50e9, 12.9e9},
		{[]string{"--model", "mixtral-8x7b", "--active-params", "14e9"}, 46.7e9, 14e9},
	} {
		code, out, errs := runCalcArgs(t, append(c.args, "--json")...)
		var r calcReport
		if code != 0 || json.Unmarshal([]byte(out), &r) != nil {
			t.Fatalf("%v: %d %s", c.args, code, errs)
		}
		if r.Model.TotalParams != c.total || r.Model.ActiveParams != c.active || !strings.HasSuffix(r.Model.Name, "+overrides") {
			t.Errorf("%v: %+v", c.args, r.Model)
		}
	}
	// A MoE's active count above the new total is an error, not a clamp.
	if code, _, errs := runCalcArgs(t, "--model", "mixtral-8x7b", "--params", "10e9"); code != 2 || !strings.Contains(errs, "active_params") {
		t.Errorf("active above total: %d %s", code, errs)
	}
}

func TestCalcTiersAndMLA(t *testing.T) {
	code, out, errs := runCalcArgs(t, "--model", "deepseek-v3", "--tier", "nvme", "--nvme", "nvme-gen4", "--drives", "4", "--serial", "--tp", "8", "--tokens", "8192")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"MLA latent 512 + rope 64", "70,272 bytes/token", "nvme-gen4-x4 then pcie5-pinned", "671B params (37B active)"} {
		if !strings.Contains(out, want) {
			t.Errorf("lacks %q:\n%s", want, out)
		}
	}
	code, out, errs = runCalcArgs(t, "--tier", "remote", "--link", "nvlink-c2c-gh200", "--gpu", "gh200", "--tokens", "1000")
	if code != 0 || !strings.Contains(out, "rdma-400g | nvlink-c2c-gh200") {
		t.Fatalf("remote tier: %d %s %s", code, out, errs)
	}
	// A 7B on a slow link recomputes short prefixes: the break-even moves out.
	code, out, _ = runCalcArgs(t, "--model", "qwen2.5-7b", "--link", "pcie4-pageable", "--latency", "20ms", "--tokens", "100")
	if code != 0 || !strings.Contains(out, "decision   recompute") {
		t.Fatalf("short prefix, slow link: %d\n%s", code, out)
	}
}

func TestCalcModelFileAndProbe(t *testing.T) {
	dir := t.TempDir()
	mf := filepath.Join(dir, "m.json")
	os.WriteFile(mf, []byte(`{"name": "tiny", "layers": 4, "q_heads": 8, "kv_heads": 2, "head_dim": 64, "total_params": 1e8}`), 0o600)
	code, out, errs := runCalcArgs(t, "--model-file", mf, "--probe", filepath.Join("..", "..", "kvtier", "cost", "testdata", "probe-h200.json"), "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var r calcReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Model.Name != "tiny" || r.KVBytesPerToken != 4*2*2*64*2 || r.Path != "probe-pcie5-x16-pinned" {
		t.Fatalf("model file + probe: %+v", r)
	}
}

func TestCalcSweepAndPlot(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"sweep.svg", "sweep.png"} {
		path := filepath.Join(dir, name)
		code, out, errs := runCalcArgs(t, "--sweep", "--tokens", "5000", "--plot", path)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		if !strings.Contains(out, "sweep over context length") || !strings.Contains(out, "     5,000 ") {
			t.Errorf("sweep table missing:\n%s", out)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		switch name {
		case "sweep.svg":
			if !bytes.Contains(data, []byte("<svg")) || !bytes.Contains(data, []byte("best split")) {
				t.Errorf("%s is not an SVG with the split line", name)
			}
		case "sweep.png":
			if !bytes.HasPrefix(data, []byte("\x89PNG")) {
				t.Errorf("%s is not a PNG", name)
			}
		}
	}
	code, out, _ := runCalcArgs(t, "--sweep", "--tokens", "300", "--json")
	var r calcReport
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil {
		t.Fatal(code, out)
	}
	if len(r.Sweep) != 4 || r.Sweep[0].Tokens != 64 || r.Sweep[3].Tokens != 300 || len(r.Sweep[0].ReloadPerLinkSeconds) != len(r.ReloadPerLink) {
		t.Fatalf("sweep rows: %+v", r.Sweep)
	}
}

func TestCalcBadInput(t *testing.T) {
	dir := t.TempDir()
	badModel := filepath.Join(dir, "bad.json")
	os.WriteFile(badModel, []byte(`{"layers": 80, "kv_head": 8}`), 0o600)
	badProbe := filepath.Join(dir, "probe.json")
	os.WriteFile(badProbe, []byte(`{"device": {}}`), 0o600)
	cases := []struct {
		args    []string
		mention []string
	}{
		{[]string{"--model", "gpt-5"}, []string{`"gpt-5"`, "llama-3.1-70b", "deepseek-v3"}},
		{[]string{"--gpu", "a100"}, []string{`"a100"`, "h200", "gb200"}},
		{[]string{"--link", "pcie3"}, []string{`"pcie3"`, "pcie5-pinned", "nvlink-c2c-gh200"}},
		{[]string{"--tier", "tape"}, []string{`"tape"`, "host, nvme, remote"}},
		{[]string{"--tier", "nvme", "--nvme", "floppy"}, []string{`"floppy"`, "nvme-gen5"}},
		{[]string{"--tier", "nvme", "--drives", "0"}, []string{"drives"}},
		{[]string{"--tier", "remote", "--rdma", "carrier-pigeon"}, []string{`"carrier-pigeon"`}},
		{[]string{"--tokens", "0"}, []string{"tokens"}},
		{[]string{"--tokens", "-5"}, []string{"tokens"}},
		{[]string{"--tokens", "99999999999"}, []string{"tokens"}},
		{[]string{"--prefix", "-1"}, []string{"prefix"}},
		{[]string{"--tp", "-1"}, []string{"tp"}},
		{[]string{"--model", "llama-3.1-70b", "--tp", "1"}, []string{"does not fit in GPU memory", "141.2 GB", "--tp 1"}},
		{[]string{"--model", "llama-3.1-405b", "--gpu-memory", "1"}, []string{"does not fit", "--tp 64"}},
		{[]string{"--gpu-memory", "0"}, []string{"--gpu-memory"}},
		{[]string{"--tp", "5000"}, []string{"tp"}},
		{[]string{"--layers", "0"}, []string{"--layers"}},
		{[]string{"--layers", "100000"}, []string{"layers"}},
		{[]string{"--kv-heads", "-8"}, []string{"--kv-heads"}},
		{[]string{"--kv-heads", "7"}, []string{"kv_heads"}},
		{[]string{"--q-heads", "0"}, []string{"--q-heads"}},
		{[]string{"--head-dim", "0"}, []string{"--head-dim"}},
		{[]string{"--params", "0"}, []string{"--params"}},
		{[]string{"--active-params", "-1"}, []string{"--active-params"}},
		{[]string{"--active-params", "1e12"}, []string{"active_params"}},
		{[]string{"--dtype", "int4"}, []string{`"int4"`, "bf16"}},
		{[]string{"--bandwidth", "0"}, []string{"--bandwidth"}},
		{[]string{"--bandwidth", "1e9"}, []string{"bandwidth"}},
		{[]string{"--latency", "-1ms"}, []string{"--latency"}},
		{[]string{"--latency", "1h"}, []string{"latency"}},
		{[]string{"--tflops", "0"}, []string{"--tflops"}},
		{[]string{"--tflops", "1e9"}, []string{"tflops"}},
		{[]string{"--efficiency", "0"}, []string{"--efficiency"}},
		{[]string{"--efficiency", "1.5"}, []string{"efficiency"}},
		{[]string{"--block-tokens", "0"}, []string{"--block-tokens"}},
		{[]string{"--model-file", badModel}, []string{badModel, `"kv_head"`}},
		{[]string{"--model-file", filepath.Join(dir, "absent.json")}, []string{"absent.json"}},
		{[]string{"--model-file", badModel, "--model", "llama-3.1-8b"}, []string{"--model-file"}},
		{[]string{"--probe", badProbe}, []string{badProbe, "measured"}},
		{[]string{"--plot", filepath.Join(dir, "x.svg")}, []string{"--sweep"}},
		{[]string{"--sweep", "--plot", filepath.Join(dir, "x.pdf")}, []string{".svg or .png"}},
		{[]string{"--sweep", "--tokens", "10"}, []string{"--sweep"}},
		{[]string{"--nonsense"}, []string{"nonsense"}},
		{[]string{"--tokens", "100", "extra"}, []string{"unexpected argument", `"extra"`}},
		{[]string{"extra"}, []string{`"extra"`}},
	}
	for _, c := range cases {
		code, out, errs := runCalcArgs(t, c.args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", c.args, code, errs)
		}
		if out != "" {
			t.Errorf("%v: wrote to stdout on error: %q", c.args, out)
		}
		for _, m := range c.mention {
			if !strings.Contains(errs, m) {
				t.Errorf("%v: stderr %q lacks %q", c.args, errs, m)
			}
		}
	}
	if code, _, _ := runCalcArgs(t, "-h"); code != 0 {
		t.Errorf("-h exits %d", code)
	}
	// A plot that cannot be written is a runtime error, not a usage one.
	if code, _, errs := runCalcArgs(t, "--sweep", "--plot", filepath.Join(dir, "no", "such", "dir.svg")); code != 1 || !strings.Contains(errs, "--plot") {
		t.Errorf("unwritable plot: exit %d, %q", code, errs)
	}
}

// TestCalcSmallestTPThatFits: without --tp, the calculator takes the
// smallest power-of-two degree at which the weights and the request's KV
// fit: 1 for an 8B model, 2 for 70B's 141 GB of weights on 141 GB H200s, 8
// for 405B.
func TestCalcSmallestTPThatFits(t *testing.T) {
	for _, c := range []struct {
		model string
		tp    int
	}{{"llama-3.1-8b", 1}, {"llama-3.1-70b", 2}, {"llama-3.1-405b", 8}} {
		code, out, errs := runCalcArgs(t, "--model", c.model, "--tokens", "32768", "--json")
		var r calcReport
		if code != 0 || json.Unmarshal([]byte(out), &r) != nil {
			t.Fatalf("%s: exit %d: %s", c.model, code, errs)
		}
		if r.TP != c.tp {
			t.Errorf("%s: tp %d, want %d", c.model, r.TP, c.tp)
		}
	}
}

// TestCalcScenarioErrors: the scenario's inputs read from files (a probe,
// a calibration, prefill samples) fail with an error naming the flag and
// the file.
func TestCalcScenarioErrors(t *testing.T) {
	dir := t.TempDir()
	pinnedOnly := filepath.Join(dir, "pinned-only.json")
	os.WriteFile(pinnedOnly, []byte(`{"measured": {"h2d_pinned_bytes_per_s": 5e10, "small_copy_issue_seconds": 2e-6}}`), 0o600)
	empty := filepath.Join(dir, "empty.jsonl")
	os.WriteFile(empty, nil, 0o600)
	absent := filepath.Join(dir, "absent")
	for _, c := range []struct {
		args    []string
		mention []string
	}{
		{[]string{"--probe", pinnedOnly, "--link", "pcie5-pageable"}, []string{"--probe " + pinnedOnly, "no pageable figure", "--link pcie5-pageable"}},
		{[]string{"--calibration", absent}, []string{"--calibration", absent}},
		{[]string{"--prefill-samples", absent}, []string{"--prefill-samples", absent}},
		{[]string{"--prefill-samples", empty}, []string{"--prefill-samples " + empty, "no sample"}},
	} {
		_, err := calcParse(c.args, io.Discard)
		if err == nil {
			t.Errorf("%v: no error", c.args)
			continue
		}
		for _, m := range c.mention {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%v: %q lacks %q", c.args, err, m)
			}
		}
	}
	// The probe's pinned figure serves a pinned --link.
	cfg, err := calcParse([]string{"--probe", pinnedOnly}, io.Discard)
	if err != nil || cfg.scenario.Path.Ingress.BandwidthBytesPerS != 5e10 {
		t.Errorf("--probe with a pinned link: %v, ingress %+v", err, cfg.scenario.Path.Ingress)
	}
}
