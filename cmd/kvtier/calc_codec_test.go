package main

import (
	"encoding/json"
	"strings"
	"testing"

	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/cost"
)

// TestCostCodecSizesMatchTheFormat: kvtier/cost computes an encoded
// block's size from the Model's shape by itself (it imports none of our
// packages); it must equal kvtier/codec's EncodedBytes for every model
// preset, block size and tensor-parallel share, so that the two cannot
// drift apart.
func TestCostCodecSizesMatchTheFormat(t *testing.T) {
	fp8, err := cost.LookupCodec("fp8-e4m3")
	if err != nil {
		t.Fatal(err)
	}
	pairs := []struct {
		cost  cost.Codec
		codec codec.Codec
	}{{cost.Codec{}, codec.None}, {fp8, codec.FP8E4M3PerHead}}
	checked := 0
	for _, name := range cost.ModelNames() {
		m, err := cost.LookupModel(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range []int{1, 2, 3, 8} {
			shape := codec.Shape{Layers: m.Layers, Parts: 2, Heads: (m.KVHeads + tp - 1) / tp, HeadDim: m.HeadDim}
			if m.IsMLA() { // one tensor per layer, the latent and its rope key, whole on every rank
				shape.Parts, shape.Heads, shape.HeadDim = 1, 1, m.KVLoraRank+m.QKRopeHeadDim
			}
			for _, tokens := range []int{1, 15, 16, 17, 64, 256} {
				shape.Tokens = tokens
				for _, p := range pairs {
					want, err := codec.EncodedBytes(p.codec, shape)
					if err != nil {
						t.Fatalf("%s: %+v: %v", name, shape, err)
					}
					if got := p.cost.EncodedBlockBytes(&m, tokens, tp); got != want {
						t.Errorf("%s tp %d, %d tokens, %s: cost says %d bytes, codec %d", name, tp, tokens, p.codec, got, want)
					}
					checked++
				}
			}
		}
	}
	if checked < 100 {
		t.Fatalf("only %d cases", checked)
	}
}

// TestCalcCodecSideBySide: over a 3.5 GB/s link a 16-token block of the 8B
// is recomputed raw but reloaded compressed; both sides are printed, in
// text and in JSON.
func TestCalcCodecSideBySide(t *testing.T) {
	args := []string{"--model", "llama-3.1-8b", "--bandwidth", "3.5", "--latency", "80us", "--tokens", "16", "--codec", "fp8-e4m3"}
	code, out, errs := runCalcArgs(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var r calcReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	c := r.Codec
	if c == nil {
		t.Fatalf("no codec in %s", out)
	}
	if c.Name != "fp8-e4m3" || c.EncodedBytesPerBlock != 2048+1048576 || c.WireBytesPerGPU != c.EncodedBytesPerBlock || !strings.Contains(c.Source, "fp8-codec-h200.md") {
		t.Errorf("codec %+v", c)
	}
	if r.Decision != "recompute" || c.Decision != "reload" {
		t.Errorf("decision %s without, %s with compression; want recompute, reload", r.Decision, c.Decision)
	}
	// 80 us + 1,050,624 B at 3.5 GB/s + one block's decode at 1.12 TB/s.
	if want := 80e-6 + 1050624/3.5e9 + 2097152/1.12e12; c.ReloadSeconds < want-1e-9 || c.ReloadSeconds > want+1e-9 {
		t.Errorf("compressed reload %g s, want %g", c.ReloadSeconds, want)
	}
	if c.BreakEvenTokens == nil || r.BreakEvenTokens == nil || *c.BreakEvenTokens >= *r.BreakEvenTokens {
		t.Errorf("break-even %v with, %v without", c.BreakEvenTokens, r.BreakEvenTokens)
	}

	code, out, errs = runCalcArgs(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{
		"compressed fp8-e4m3: 1,050,624 bytes/block of 16 tokens (0.501 of 2,097,152)",
		"without      with fp8-e4m3",
		"  decision                                      recompute             reload\n",
		"break-even (recompute with attention)",
		"break-even (linear only)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	// No flag, or --codec none: no compressed side.
	for _, extra := range [][]string{nil, {"--codec", "none"}} {
		code, out, _ = runCalcArgs(t, append([]string{"--model", "llama-3.1-8b", "--json"}, extra...)...)
		if code != 0 || strings.Contains(out, `"codec"`) {
			t.Errorf("%v: exit %d, codec in %s", extra, code, out)
		}
	}
}

func TestCalcCodecBadInput(t *testing.T) {
	for _, c := range []struct {
		args    []string
		mention []string
	}{
		{[]string{"--codec", "fp9"}, []string{"--codec fp9", `"fp9"`, "fp8-e4m3"}},
		{[]string{"--codec", "fp8-e4m3", "--dtype", "fp8"}, []string{"--codec fp8-e4m3", "dtype", "bf16"}},
		{[]string{"--codec", "fp8-e4m3", "--dtype", "fp16"}, []string{"--codec fp8-e4m3", "dtype"}},
	} {
		code, out, errs := runCalcArgs(t, c.args...)
		if code != 2 || out != "" {
			t.Errorf("%v: exit %d, stdout %q", c.args, code, out)
		}
		for _, m := range c.mention {
			if !strings.Contains(errs, m) {
				t.Errorf("%v: stderr %q lacks %q", c.args, errs, m)
			}
		}
	}
}
