package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"kvtier.dev/examples/server/internal/kvdrift"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/internal/results"
)

// report is one run's outcome: the rows and notes of results.File, the
// summary by range of cached tokens, and every prompt's result.
type report struct {
	file    *results.File
	all     kvdrift.Summary
	bins    []bin
	prompts []kvdrift.Result
	steps   int
}

// bin is the prompts with cached tokens in [lo, hi).
type bin struct {
	lo, hi int
	sum    kvdrift.Summary
}

// binEdges split cached counts at 4K, 8K, 16K and 32K tokens.
var binEdges = []int{4096, 8192, 16384, 32768}

func binsOf(rs []kvdrift.Result) []bin {
	var out []bin
	lo := 0
	for _, hi := range append(binEdges, 1<<62) {
		var in []kvdrift.Result
		for _, r := range rs {
			if r.CachedTokens >= lo && r.CachedTokens < hi {
				in = append(in, r)
			}
		}
		if len(in) > 0 {
			out = append(out, bin{lo: lo, hi: hi, sum: kvdrift.Summarize(in)})
		}
		lo = hi
	}
	return out
}

func newReport(c model.Config, f flags, setup string, rs []kvdrift.Result, took time.Duration) *report {
	rep := &report{file: results.New("codecacc", f.machine, f.commit), all: kvdrift.Summarize(rs), bins: binsOf(rs), prompts: rs, steps: f.steps}
	s := rep.all
	rep.file.Notes = []string{
		fmt.Sprintf("%s shapes (%d layers, %d KV heads of %d, vocabulary %d), bf16 weights seeded at random (seed %d); KV in blocks of %d tokens (%d KiB), FP8 e4m3 with a scale per (layer, K or V, head) and block (package codec)",
			c.Name, c.Layers, c.KVHeads, c.HeadDim, c.Vocab, f.seed, c.BlockTokens, c.BlockBytes()>>10),
		setup,
		fmt.Sprintf("%d prompts of random tokens: %d-%d cached tokens (uniform over whole blocks), then %d tokens computed on top; a %d-token greedy continuation", s.Prompts, f.cachedMin, f.cachedMax, f.tail, f.steps),
		"per prompt: a one-shot prefill into slots A; the cached blocks' round trip through the codec into slots B; the tail computed over A and over B; both continuations step by step until they differ (examples/server/internal/kvdrift)",
		"drift = largest |logit over B - logit over A| over the vocabulary at a position (of the logits' standard deviation over the vocabulary: 'of spread'); noise = the tail over A against the one-shot prefill (passes of other shapes, no codec); continuation = the largest drift at any position both reached with the same tokens; logprob drift = of the token both chose, as bench-serve --verify's max_drift",
		"the tail drift row's ratio is the noise's median over its own (below 1: the codec moves the logits more than reuse alone does)",
		fmt.Sprintf("%d prompts compared in %.0f s (%.2f s each, the model's construction not counted)", len(rs), took.Seconds(), took.Seconds()/float64(max(1, len(rs)))),
		fmt.Sprintf("a first differing token is a near tie when each side's token beats the other's by at most %g nats in its own logits (bench-serve --verify's rule, benchserve.TieGap)", f.tolerance),
		fmt.Sprintf("%d of %d continuations agree (%.4f); %d more differ first at a near tie (%.4f with them); %d differ; %d tokens compared; largest logit drift %.4g (%.3g of spread) in the tail, %.4g (%.3g of spread) over the continuations; largest logprob drift %.4g nats; largest gap of a first difference %.4g nats",
			s.Agree, s.Prompts, s.Agreement, s.Ties, s.AgreementWithTies, s.Differences, s.Tokens, s.Prefill.Abs, s.Prefill.OfStd, s.Continuation.Abs, s.Continuation.OfStd, s.LogprobDrift, s.LargestGap),
	}
	rep.addRows()
	return rep
}

// addRows adds the per-prompt distributions (median, min, max over the
// prompts) and the agreement ratios.
func (rep *report) addRows() {
	f := rep.file
	pick := func(get func(kvdrift.Result) float64) []float64 {
		v := make([]float64, len(rep.prompts))
		for i, r := range rep.prompts {
			v[i] = get(r)
		}
		return v
	}
	f.Add("noise: tail drift without the codec", "logit", pick(func(r kvdrift.Result) float64 { return r.Noise.Abs }), "")
	f.Add("tail drift", "logit", pick(func(r kvdrift.Result) float64 { return r.Prefill.Abs }), "noise: tail drift without the codec")
	f.Add("tail drift of spread", "ratio", pick(func(r kvdrift.Result) float64 { return r.Prefill.OfStd }), "")
	f.Add("continuation drift", "logit", pick(func(r kvdrift.Result) float64 { return r.Continuation.Abs }), "")
	f.Add("continuation drift of spread", "ratio", pick(func(r kvdrift.Result) float64 { return r.Continuation.OfStd }), "")
	f.Add("chosen token's logprob drift", "nats", pick(func(r kvdrift.Result) float64 { return r.LogprobDrift }), "")
	for _, b := range rep.bins {
		var v []float64
		for _, r := range rep.prompts {
			if r.CachedTokens >= b.lo && r.CachedTokens < b.hi {
				v = append(v, r.Prefill.Abs)
			}
		}
		f.Add(fmt.Sprintf("tail drift, %s cached", b.name()), "logit", v, "")
	}
	ratio := func(name string, v float64) {
		f.Rows = append(f.Rows, results.Row{Name: name, Unit: "fraction", Median: v, Min: v, Max: v, Runs: rep.all.Prompts, Ratio: 1})
	}
	ratio(fmt.Sprintf("%d-token continuations agreeing", rep.steps), rep.all.Agreement)
	ratio(fmt.Sprintf("%d-token continuations agreeing or first differing at a near tie", rep.steps), rep.all.AgreementWithTies)
}

func (b bin) name() string {
	k := func(n int) string { return fmt.Sprintf("%gK", float64(n)/1024) }
	switch {
	case b.lo == 0:
		return "below " + k(b.hi)
	case b.hi >= 1<<62:
		return k(b.lo) + "+"
	}
	return k(b.lo) + "-" + k(b.hi)
}

// headline is the run's outcome in one line.
func (rep *report) headline() string {
	s := rep.all
	return fmt.Sprintf("%d prompts, %d-%d cached tokens: %d of %d-token continuations agree (%.4f), %d near ties (%.4f with them), %d differ; largest logit drift %.4g (%.3g of spread) in the tail, %.4g over the continuations; noise without the codec up to %.4g",
		s.Prompts, s.CachedMin, s.CachedMax, s.Agree, rep.steps, s.Agreement, s.Ties, s.AgreementWithTies, s.Differences, s.Prefill.Abs, s.Prefill.OfStd, s.Continuation.Abs, s.Noise.Abs)
}

// markdown writes results.File's table, then agreement and drift by
// range of cached tokens.
func (rep *report) markdown(w io.Writer) error {
	if err := rep.file.Markdown(w); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| cached tokens | prompts | agree | near ties | differ | agreement | with ties | largest tail drift | of spread | largest continuation drift |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range append(rep.bins, bin{lo: -1, sum: rep.all}) {
		name := x.name()
		if x.lo < 0 {
			name = "all"
		}
		s := x.sum
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %.4f | %.4f | %.4g | %.3g | %.4g |\n",
			name, s.Prompts, s.Agree, s.Ties, s.Differences, s.Agreement, s.AgreementWithTies, s.Prefill.Abs, s.Prefill.OfStd, s.Continuation.Abs)
	}
	rep.gapTable(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// gapEdges split the first differences by their near-tie gap (nats).
var gapEdges = []float64{0.1, 0.25, 0.5, 1}

// gapTable writes how many continuations differed first at a gap of at
// most each of gapEdges, and above the last: how close the choices the
// codec flipped were.
func (rep *report) gapTable(b *strings.Builder) {
	counts := make([]int, len(gapEdges)+1)
	for _, r := range rep.prompts {
		if r.Agree {
			continue
		}
		i := 0
		for i < len(gapEdges) && r.Gap > gapEdges[i] {
			i++
		}
		counts[i]++
	}
	b.WriteString("\n| first differences at a gap of | ")
	for _, e := range gapEdges {
		fmt.Fprintf(b, "<= %g | ", e)
	}
	fmt.Fprintf(b, "> %g |\n|---|", gapEdges[len(gapEdges)-1])
	for range counts {
		b.WriteString("---|")
	}
	b.WriteString("\n| continuations | ")
	for _, n := range counts {
		fmt.Fprintf(b, "%d | ", n)
	}
	b.WriteString("\n")
}

// write saves codecacc-<machine>.{json,md} and -prompts.jsonl under dir.
func (rep *report) write(dir string) error {
	if err := rep.file.Write(dir); err != nil {
		return fmt.Errorf("-out %s: %w", dir, err)
	}
	base := filepath.Join(dir, rep.file.Benchmark+"-"+rep.file.Machine)
	var md strings.Builder
	if err := rep.markdown(&md); err != nil {
		return err
	}
	var jl []byte
	for _, r := range rep.prompts {
		line, err := json.Marshal(r)
		if err != nil {
			return err
		}
		jl = append(append(jl, line...), '\n')
	}
	for path, b := range map[string][]byte{base + ".md": []byte(md.String()), base + "-prompts.jsonl": jl} {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return fmt.Errorf("-out: %w", err)
		}
	}
	return nil
}
