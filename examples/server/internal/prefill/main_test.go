package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvtier.dev/examples/server/internal/gpu"
	"kvtier.dev/internal/results"
)

// TestCheckFlags: run counts below 1, an unknown attention kernel, a
// baseline that cannot be read or measured another model, and an unknown
// model are errors naming the flag, found before any GPU is opened.
func TestCheckFlags(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other.json")
	os.WriteFile(other, []byte(`{"device": "x", "model": "llama-3.2-1b", "cases": {"prefill 2048": [0.1]}}`), 0o600)
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{bad`), 0o600)
	good := flags{model: "llama-3.2-1b", blockTokens: 16, runs: 3, decodeRuns: 20, attention: "auto"}
	for _, c := range []struct {
		edit func(*flags)
		want string
	}{
		{func(f *flags) { f.runs = 0 }, "-runs (0) and -decode-runs (20) must be at least 1"},
		{func(f *flags) { f.decodeRuns = 0 }, "-decode-runs (0)"},
		{func(f *flags) { f.baseline = filepath.Join(dir, "absent.json") }, "-baseline: "},
		{func(f *flags) { f.baseline = bad }, "-baseline " + bad},
		{func(f *flags) { f.baseline, f.model = other, "tiny" }, "measured llama-3.2-1b, not -model tiny"},
		{func(f *flags) { f.model = "gpt-9" }, "-model: "},
		{func(f *flags) { f.attention = "fa3" }, `-attention: gpu: attention kernel "fa3"`},
	} {
		f := good
		c.edit(&f)
		if _, _, _, err := checkFlags(f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error containing %q", f, err, c.want)
		}
	}
	f := good
	f.baseline = other
	f.attention = "mma"
	base, cfg, att, err := checkFlags(f)
	if err != nil || base.Device != "x" || cfg.Name != "llama-3.2-1b" || att != gpu.AttentionMMA {
		t.Errorf("good flags: %v, baseline %+v, model %q, attention %v", err, base, cfg.Name, att)
	}
}

// TestAddCase: a case without a baseline is one row; with one, PyTorch's
// row and ours against it, the ratio ours over PyTorch.
func TestAddCase(t *testing.T) {
	res := results.New("prefill", "test", "")
	base := torchRuns{Cases: map[string][]float64{"prefill 2048": {0.2}}}
	addCase(res, prefillCase{name: "prefill 8192", target: 1.5}, []float64{0.5}, base)
	addCase(res, prefillCase{name: "prefill 2048", target: 1.5}, []float64{0.3}, base)
	if len(res.Rows) != 3 {
		t.Fatalf("rows %+v", res.Rows)
	}
	if r := res.Rows[0]; r.Name != "prefill 8192 kvtier model (Go, cuBLAS)" || r.Baseline != "" {
		t.Errorf("no baseline: %+v", r)
	}
	if r := res.Rows[1]; r.Name != "prefill 2048 PyTorch SDPA" {
		t.Errorf("PyTorch's row: %+v", r)
	}
	if r := res.Rows[2]; r.Baseline != "prefill 2048 PyTorch SDPA" || r.Ratio < 1.49 || r.Ratio > 1.51 {
		t.Errorf("ours against PyTorch: %+v, want ratio 1.5", r)
	}
}
