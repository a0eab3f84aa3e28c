package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/kvdrift"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/codec"
)

// TestFlagErrors: each bad flag is named before any GPU work.
func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-model", "gpt-9"}, `-model "gpt-9"`},
		{[]string{"-block-tokens", "0"}, "BlockTokens"},
		{[]string{"-prompts", "0"}, "-prompts 0"},
		{[]string{"-cached-min", "0"}, "-cached-min 0"},
		{[]string{"-cached-min", "4000", "-cached-max", "2000"}, "-cached-min 4000, -cached-max 2000"},
		{[]string{"-cached-min", "17", "-cached-max", "31"}, "at least one whole block of 16 tokens"},
		{[]string{"-tail", "0"}, "-tail 0"},
		{[]string{"-steps", "-1"}, "-steps -1"},
		{[]string{"-tolerance", "-0.5"}, "-tolerance -0.5"},
		{[]string{"-tolerance", "NaN"}, "-tolerance NaN"},
		{[]string{"-codec", "zstd"}, `-codec "zstd"`},
		{[]string{"-machine", "a/b"}, `-machine "a/b"`},
		{[]string{"-prompts", "x"}, `invalid value "x"`},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
	} {
		err := run(tc.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: want an error with %q, got %v", tc.args, tc.want, err)
		}
	}
}

// TestCachedRangeRounded: the cached range becomes whole blocks.
func TestCachedRangeRounded(t *testing.T) {
	f, err := parseFlags([]string{"-cached-min", "2001", "-cached-max", "4100"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.check(); err != nil {
		t.Fatal(err)
	}
	if f.cachedMin != 2016 || f.cachedMax != 4096 {
		t.Fatalf("cached range %d-%d, want 2016-4096", f.cachedMin, f.cachedMax)
	}
}

// TestPrompts: prompt i is a pure function of (seed, i); cached counts are
// whole blocks in range and reach both ends; tokens are in the vocabulary.
func TestPrompts(t *testing.T) {
	c := model.Tiny()
	f := flags{seed: 3, cachedMin: 8, cachedMax: 20, tail: 5}
	seen := map[int]bool{}
	for i := range 200 {
		p := prompt(c, f, i)
		if p.Cached < 8 || p.Cached > 20 || p.Cached%c.BlockTokens != 0 || len(p.Tokens) != p.Cached+5 {
			t.Fatalf("prompt %d: %d cached of %d tokens", i, p.Cached, len(p.Tokens))
		}
		for _, tok := range p.Tokens {
			if tok < 0 || int(tok) >= c.Vocab {
				t.Fatalf("prompt %d: token %d", i, tok)
			}
		}
		seen[p.Cached] = true
	}
	if len(seen) != 4 {
		t.Fatalf("cached counts seen: %v, want 8, 12, 16 and 20", seen)
	}
	a, b := prompt(c, f, 7), prompt(c, f, 7)
	if a.Cached != b.Cached || !slices.Equal(a.Tokens, b.Tokens) {
		t.Fatal("prompt 7 differs between two calls")
	}
	if other := prompt(c, flags{seed: 4, cachedMin: 8, cachedMax: 20, tail: 5}, 7); slices.Equal(other.Tokens, a.Tokens) {
		t.Fatal("the seed does not change the prompt")
	}
}

// TestReport: rows, bins and files from a set of results.
func TestReport(t *testing.T) {
	rs := []kvdrift.Result{
		{CachedTokens: 2048, Agree: true, Compared: 32, Prefill: kvdrift.Drift{Abs: 0.2, OfStd: 0.02}},
		{CachedTokens: 5000, Tie: true, Gap: 0.05, FirstDiff: 9, Compared: 10, Prefill: kvdrift.Drift{Abs: 0.4, OfStd: 0.05}},
		{CachedTokens: 9000, Agree: true, Compared: 32, Prefill: kvdrift.Drift{Abs: 0.3, OfStd: 0.03}, Noise: kvdrift.Drift{Abs: 0.1}},
		{CachedTokens: 9100, Gap: 3, FirstDiff: 0, Compared: 1, Prefill: kvdrift.Drift{Abs: 0.6, OfStd: 0.07}},
	}
	f := flags{model: "tiny", seed: 1, cachedMin: 2048, cachedMax: 16384, tail: 64, steps: 32, tolerance: 0.1, machine: "test", commit: "abc"}
	rep := newReport(model.Tiny(), f, "a setup", rs, 8*time.Second)
	bins := rep.bins
	if len(bins) != 3 || bins[0].name() != "below 4K" || bins[1].sum.Prompts != 1 || bins[2].name() != "8K-16K" || bins[2].sum.Prompts != 2 {
		t.Fatalf("bins: %+v", bins)
	}
	if !strings.Contains(rep.headline(), "2 of 32-token continuations agree (0.5000), 1 near ties (0.7500 with them), 1 differ; largest logit drift 0.6") {
		t.Fatalf("headline: %s", rep.headline())
	}
	row := func(name string) results.Row {
		for _, r := range rep.file.Rows {
			if r.Name == name {
				return r
			}
		}
		t.Fatalf("no row %q in %+v", name, rep.file.Rows)
		return results.Row{}
	}
	if r := row("tail drift"); r.Max != 0.6 || r.Min != 0.2 || r.Runs != 4 || r.Median != 0.35 {
		t.Errorf("tail drift row: %+v", r)
	}
	if r := row("32-token continuations agreeing or first differing at a near tie"); r.Median != 0.75 || r.Runs != 4 {
		t.Errorf("agreement row: %+v", r)
	}
	if r := row("tail drift, 8K-16K cached"); r.Runs != 2 || r.Max != 0.6 {
		t.Errorf("8K-16K row: %+v", r)
	}
	dir := t.TempDir()
	if err := rep.write(dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "codecacc-test.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| tail drift | logit |", "4 prompts compared in 8 s (2.00 s each", "| 8K-16K | 2 | 1 | 0 | 1 | 0.5000 | 0.5000 | 0.6 |", "| all | 4 | 2 | 1 | 1 |",
		"| first differences at a gap of | <= 0.1 | <= 0.25 | <= 0.5 | <= 1 | > 1 |", "| continuations | 1 | 0 | 0 | 0 | 1 | "} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the markdown lacks %q:\n%s", want, md)
		}
	}
	var file results.File
	if b, err := os.ReadFile(filepath.Join(dir, "codecacc-test.json")); err != nil || json.Unmarshal(b, &file) != nil || file.Commit != "abc" {
		t.Fatalf("the JSON: %v, %+v", err, file)
	}
	jl, err := os.ReadFile(filepath.Join(dir, "codecacc-test-prompts.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(jl), []byte("\n"))
	var last kvdrift.Result
	if len(lines) != 4 || json.Unmarshal(lines[3], &last) != nil || last != rs[3] {
		t.Fatalf("prompts.jsonl: %d lines, last %+v", len(lines), last)
	}
}

// TestRunWithoutGPU: a small run either works (a GPU machine) or ends with
// cudastream.ErrNoDriver (no driver, or a build without cgo).
func TestRunWithoutGPU(t *testing.T) {
	dir := t.TempDir()
	err := run([]string{"-model", "tiny", "-prompts", "2", "-cached-min", "16", "-cached-max", "32", "-tail", "4", "-steps", "3", "-machine", "t", "-out", dir}, io.Discard, io.Discard)
	if err != nil && !errors.Is(err, cudastream.ErrNoDriver) {
		t.Fatalf("run: %v", err)
	}
	if _, serr := os.Stat(filepath.Join(dir, "codecacc-t.md")); (err == nil) != (serr == nil) {
		t.Fatalf("run returned %v, the report: %v", err, serr)
	}
}

// TestRunAllOnCPU: the run's loop and report over the CPU reference at
// the tiny shape, with the codec in Go over its region: every prompt is
// compared, the tail over the original blocks equals the one-shot prefill
// (no GPU rounding here) and the codec moves the logits.
func TestRunAllOnCPU(t *testing.T) {
	f, err := parseFlags([]string{"-model", "tiny", "-prompts", "3", "-cached-min", "32", "-cached-max", "64", "-tail", "8", "-steps", "4", "-machine", "cpu"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.check()
	if err != nil {
		t.Fatal(err)
	}
	perSide := (&kvdrift.Setup{Config: c, Steps: f.steps}).SlotsPerSide(f.cachedMax + f.tail)
	m, err := model.NewCPU(c, f.seed, 2*perSide)
	if err != nil {
		t.Fatal(err)
	}
	h, err := kvdrift.NewHostRecoder(c, codec.FP8E4M3PerHead, m.Slot)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{c: c, perSide: perSide, fw: m, recoder: h, setup: "the CPU reference"}
	rs, took, err := r.runAll(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 || took <= 0 {
		t.Fatalf("%d results in %v", len(rs), took)
	}
	for i, res := range rs {
		if want := prompt(c, f, i).Cached; res.CachedTokens != want || res.Noise != (kvdrift.Drift{}) || res.Prefill.Abs == 0 {
			t.Fatalf("prompt %d (%d cached): %+v", i, want, res)
		}
	}
	dir := t.TempDir()
	if err := newReport(c, f, r.setup, rs, took).write(dir); err != nil {
		t.Fatal(err)
	}
	if md, err := os.ReadFile(filepath.Join(dir, "codecacc-cpu.md")); err != nil || !strings.Contains(string(md), "the CPU reference") {
		t.Fatalf("the markdown (%v):\n%s", err, md)
	}
}
