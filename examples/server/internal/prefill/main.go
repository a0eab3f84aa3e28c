// Prefill times package model's Llama-architecture forward pass on the GPU
// (examples/server/internal/gpu: cuBLAS products and CUDA C kernels over
// kvtier's paged KV blocks) next to PyTorch's on the same GPU, run just
// before by benchmarks/prefill/torch_prefill.py, and writes
// prefill-<machine>.{json,md} (benchmarks/results/). It lives here, not
// under benchmarks/, because the model packages are internal to
// examples/server.
//
//	python3 benchmarks/prefill/torch_prefill.py --out torch.json
//	go run ./examples/server/internal/prefill -baseline torch.json -results benchmarks/results
//
// Cases (llama-3.1-8b shapes by default, seeded weights, blocks of 16
// tokens): prefill of 2048, 8192 and 32768 tokens; 512 tokens after an
// 8192-token prefix already in the blocks; one decode step at batch 1
// after 8192 tokens. Each case runs once to warm up, then -runs times (the
// decode step -decode-runs times); a run is the wall time of one Forward,
// which returns once the GPU is done and the logits are on the host.
//
// With -samples FILE it times short passes instead (64 to 8,192 tokens from
// scratch, 64 to 1,024 after 2K to 24K cached) and writes them as
// `kvtier calc --prefill-samples` reads them: the runtime's own calibration
// (benchmarks/results/prefill-short-h200-runtime.md).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/gpu"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/internal/results"
)

type flags struct {
	model       string
	blockTokens int
	runs        int
	decodeRuns  int
	baseline    string
	resultsDir  string
	machine     string
	commit      string
	samples     string
	attention   string
	stages      bool
}

func parseFlags() flags {
	var f flags
	flag.StringVar(&f.model, "model", "llama-3.1-8b", "model preset (llama-3.1-8b, llama-3.2-1b, qwen2.5-7b, tiny)")
	flag.IntVar(&f.blockTokens, "block-tokens", 16, "tokens per KV block")
	flag.IntVar(&f.runs, "runs", 3, "timed runs per prefill case")
	flag.IntVar(&f.decodeRuns, "decode-runs", 20, "timed decode steps")
	flag.StringVar(&f.baseline, "baseline", "", "torch_prefill.py's JSON output, measured in the same run")
	flag.StringVar(&f.resultsDir, "results", "", "directory for prefill-<machine>.{json,md} (empty: print only)")
	flag.StringVar(&f.machine, "machine", "h200", "machine name in the results")
	flag.StringVar(&f.commit, "commit", "", "commit to record (default: the build's)")
	flag.StringVar(&f.samples, "samples", "", "instead of the cases above, time short passes (64 to 8192 tokens from position 0; 64 to 1024 after 2K to 24K cached) and write their medians to this file as kvtier calc --prefill-samples reads them")
	flag.StringVar(&f.attention, "attention", "auto", "fused attention kernel: auto (wgmma on Hopper, else mma), mma or wgmma")
	flag.BoolVar(&f.stages, "stages", false, "after each case's timed runs, one more pass with a CUDA event between stages: add its device seconds per stage (norms, products, rotary, gather, attention, ...) as rows")
	flag.Parse()
	return f
}

// torchRuns is torch_prefill.py's output.
type torchRuns struct {
	Device string               `json:"device"`
	Torch  string               `json:"torch"`
	Model  string               `json:"model"`
	Cases  map[string][]float64 `json:"cases"`
}

func readBaseline(path string) (torchRuns, error) {
	var t torchRuns
	if path == "" {
		return t, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return t, fmt.Errorf("-baseline: %w", err)
	}
	if err := json.Unmarshal(b, &t); err != nil {
		return t, fmt.Errorf("-baseline %s: %w", path, err)
	}
	return t, nil
}

type bench struct {
	dev    cudastream.Device
	region cudastream.DevicePtr // the KV blocks
	m      *gpu.Model
	c      model.Config
	tok    []int32
}

// maxCtx is the longest context a case runs: the KV region's size.
const maxCtx = 32768

// newBench makes model c on dev, with a KV region of maxCtx tokens, and
// the token ids the cases feed it. The caller MUST close it.
func newBench(dev cudastream.Device, c model.Config, att gpu.Attention) (*bench, error) {
	slots := c.Blocks(maxCtx)
	region, err := dev.Alloc(int64(slots) * c.BlockBytes())
	if err != nil {
		return nil, fmt.Errorf("KV region of %d blocks: %w", slots, err)
	}
	t0 := time.Now()
	m, err := gpu.New(c, 1, region, slots, gpu.Options{MaxTokens: maxCtx, MaxContext: maxCtx, Attention: att})
	if err != nil {
		dev.Free(region)
		return nil, err
	}
	log.Printf("%s: %d params made on the GPU in %v; cuBLAS %s; attention %s", c.Name, c.Params(), time.Since(t0).Round(time.Millisecond), m.Library(), m.AttentionKernel())
	b := &bench{dev: dev, region: region, m: m, c: c, tok: make([]int32, maxCtx)}
	for i := range b.tok {
		b.tok[i] = int32((i*7919 + 13) % c.Vocab)
	}
	return b, nil
}

// close frees the model and the KV region.
func (b *bench) close() {
	b.m.Close()
	b.dev.Free(b.region)
}

func (b *bench) plan(n, from int) model.Plan {
	p := model.Plan{Slots: make([]int32, b.c.Blocks(n))}
	for i := range p.Slots {
		p.Slots[i] = int32(i)
	}
	for q := from; q < n; q++ {
		p.Compute = append(p.Compute, int32(q))
	}
	return p
}

// time runs the pass once to warm up, then runs times.
func (b *bench) time(n, from, runs int) ([]float64, error) {
	p := b.plan(n, from)
	var out []float64
	for i := range runs + 1 {
		t0 := time.Now()
		if _, _, err := b.m.Forward(b.tok[:n], p); err != nil {
			return nil, err
		}
		if i > 0 {
			out = append(out, time.Since(t0).Seconds())
		}
	}
	return out, nil
}

func run(f flags) error {
	base, c, att, err := checkFlags(f)
	if err != nil {
		return err
	}
	dev, err := cudastream.Open(0)
	if err != nil {
		return err
	}
	defer dev.Close()
	b, err := newBench(dev, c, att)
	if err != nil {
		return err
	}
	defer b.close()
	if f.samples != "" {
		return b.writeSamples(f.samples, f.runs)
	}
	res := results.New("prefill", f.machine, f.commit)
	res.Notes = append(res.Notes, notes(c, dev.Info(), b.m.Library(), b.m.AttentionKernel(), base)...)
	if f.stages {
		res.Notes = append(res.Notes, "rows named '<case> stage <stage>': device seconds of one more pass of the case with a CUDA event recorded between stages (Options.StageTimes), summed over the layers; 'wait for the layer's KV' is the time from a layer's start to its first kernel")
	}
	if err := b.measure(res, prefillCases(f), base, f.stages); err != nil {
		return err
	}
	if f.resultsDir == "" {
		return res.Markdown(os.Stdout)
	}
	return res.Write(f.resultsDir)
}

// checkFlags checks the run counts and the attention kernel's name, reads
// the baseline (which must have measured -model) and looks the model up.
func checkFlags(f flags) (torchRuns, model.Config, gpu.Attention, error) {
	if f.runs < 1 || f.decodeRuns < 1 {
		return torchRuns{}, model.Config{}, 0, fmt.Errorf("-runs (%d) and -decode-runs (%d) must be at least 1", f.runs, f.decodeRuns)
	}
	att, err := gpu.ParseAttention(f.attention)
	if err != nil {
		return torchRuns{}, model.Config{}, 0, fmt.Errorf("-attention: %w", err)
	}
	base, err := readBaseline(f.baseline)
	if err != nil {
		return torchRuns{}, model.Config{}, 0, err
	}
	if base.Model != "" && base.Model != f.model {
		return torchRuns{}, model.Config{}, 0, fmt.Errorf("-baseline %s measured %s, not -model %s", f.baseline, base.Model, f.model)
	}
	c, err := model.Lookup(f.model, f.blockTokens)
	if err != nil {
		return torchRuns{}, model.Config{}, 0, fmt.Errorf("-model: %w", err)
	}
	return base, c, att, nil
}

// notes describe the model, the device and library, how to run the
// comparison, the baseline and what a row's figures are.
func notes(c model.Config, info cudastream.Info, library, attention string, base torchRuns) []string {
	n := []string{
		fmt.Sprintf("%s shapes (%d layers, hidden %d, %d query / %d KV heads of %d, MLP %d, vocabulary %d), bf16 weights seeded at random; KV in blocks of %d tokens (%d KiB)",
			c.Name, c.Layers, c.Hidden, c.QHeads, c.KVHeads, c.HeadDim, c.Intermediate, c.Vocab, c.BlockTokens, c.BlockBytes()>>10),
		fmt.Sprintf("device: %s; ours: examples/server/internal/gpu from Go: cuBLAS (%s) bf16 products with fp32 accumulation for the linear layers, CUDA C kernels for the rest (kernels/model.cu, PTX from clang 14; kernels/hopper.cu, PTX from nvcc for compute_90a); attention reads K/V gathered from the paged blocks, prefills (64+ positions) through the fused tensor-core kernel %s, the decode step through cuBLAS products + a masked-softmax kernel", info.Name, library, attention),
		"run on the device as one command: python3 torch_prefill.py --out torch.json, then ./prefill -baseline torch.json -results DIR (the binary of examples/server/internal/prefill built at the commit below)",
		"baseline: benchmarks/prefill/torch_prefill.py in the same run: PyTorch eager, the same shapes in bf16, F.scaled_dot_product_attention (enable_gqa; lower-right causal mask for the cached-prefix case), a static KV cache",
		"seconds = wall time of one forward pass to the greedy next token on the host; one warm-up, then the runs; ratio = ours / PyTorch seconds (below 1: ours is faster) — the inverse of results' usual time ratio, as issue 12 asks",
	}
	if base.Device != "" {
		n = append(n, fmt.Sprintf("PyTorch %s on %s", base.Torch, base.Device))
	}
	return n
}

// prefillCase is one timed pass: positions from to n computed, the ones
// before already in the blocks (prefixed: after the 8192-token prefix),
// runs times, and its target against PyTorch (0: none).
type prefillCase struct {
	name     string
	n, from  int
	runs     int
	target   float64
	prefixed bool
}

func prefillCases(f flags) []prefillCase {
	return []prefillCase{
		{"prefill 2048", 2048, 0, f.runs, 1.5, false},
		{"prefill 8192", 8192, 0, f.runs, 1.5, false},
		{"prefill 32768", 32768, 0, f.runs, 2, false},
		{"prefill 512 after 8192 cached", 8704, 8192, f.runs, 1.5, true},
		{"decode 1 token after 8192", 8193, 8192, f.decodeRuns, 0, true},
	}
}

// measure times every case and adds its rows; before the first case after
// the prefix, it prefills the prefix.
func (b *bench) measure(res *results.File, cases []prefillCase, base torchRuns, stages bool) error {
	prefixDone := false
	for _, k := range cases {
		if k.prefixed && !prefixDone {
			if _, _, err := b.m.Forward(b.tok[:8192], b.plan(8192, 0)); err != nil {
				return err
			}
			prefixDone = true
		}
		ours, err := b.time(k.n, k.from, k.runs)
		if err != nil {
			return fmt.Errorf("%s: %w", k.name, err)
		}
		addCase(res, k, ours, base)
		if stages {
			if err := b.stages(res, k); err != nil {
				return fmt.Errorf("%s: stages: %w", k.name, err)
			}
		}
	}
	return nil
}

// stages runs case k once more with a CUDA event between stages and adds
// a row per stage: its device seconds in that pass.
func (b *bench) stages(res *results.File, k prefillCase) error {
	b.m.SetStageTimes(true)
	defer b.m.SetStageTimes(false)
	b.m.Stages() // nothing from before
	if _, _, err := b.m.Forward(b.tok[:k.n], b.plan(k.n, k.from)); err != nil {
		return err
	}
	total := 0.0
	for _, s := range b.m.Stages() {
		res.Add(k.name+" stage "+s.Name, "s", []float64{s.Seconds}, "")
		total += s.Seconds
		log.Printf("%s: stage %-30s %.4f s", k.name, s.Name, s.Seconds)
	}
	log.Printf("%s: stages sum to %.4f s", k.name, total)
	return nil
}

// addCase adds case k's rows, ours alone or PyTorch's and ours against it
// (ratio ours / PyTorch), and logs them against the case's target.
func addCase(res *results.File, k prefillCase, ours []float64, base torchRuns) {
	oursName := k.name + " kvtier model (Go, cuBLAS)"
	torch, ok := base.Cases[k.name]
	if !ok {
		r := res.Add(oursName, "s", ours, "")
		log.Printf("%s: %.4f s (no baseline)", k.name, r.Median)
		return
	}
	tname := k.name + " PyTorch SDPA"
	tr := res.Add(tname, "s", torch, "")
	r := res.Add(oursName, "s", ours, tname)
	ratio := r.Median / tr.Median
	res.Rows[len(res.Rows)-1].Ratio = ratio
	verdict := "no target"
	if k.target > 0 {
		verdict = fmt.Sprintf("target <= %.1fx: %v", k.target, ratio <= k.target)
	}
	log.Printf("%s: ours %.4f s, PyTorch %.4f s, ours/PyTorch %.2f (%s)", k.name, r.Median, tr.Median, ratio, verdict)
}

// sampleGrid is -samples' passes: (prefix, tokens), the prefix's KV
// already in the blocks.
func sampleGrid() [][2]int {
	var g [][2]int
	for _, n := range []int{64, 128, 256, 512, 1024, 2048, 4096, 8192} {
		g = append(g, [2]int{0, n})
	}
	for _, p := range []int{2048, 8192, 16384, 24576} {
		for _, n := range []int{64, 128, 256, 512, 1024} {
			g = append(g, [2]int{p, n})
		}
	}
	return g
}

// writeSamples times sampleGrid's passes (the median of runs after a
// warm-up) and writes them to path, a JSON object a line.
func (b *bench) writeSamples(path string, runs int) error {
	// Every position a prefixed pass reads is written once first.
	if _, _, err := b.m.Forward(b.tok[:maxCtx], b.plan(maxCtx, 0)); err != nil {
		return err
	}
	var out []byte
	for _, g := range sampleGrid() {
		prefix, n := g[0], g[1]
		t, err := b.time(prefix+n, prefix, runs)
		if err != nil {
			return fmt.Errorf("%d tokens after %d: %w", n, prefix, err)
		}
		line, err := json.Marshal(map[string]any{"model": b.c.Name, "prefix": prefix, "tokens": n, "seconds": results.Median(t)})
		if err != nil {
			return err
		}
		log.Printf("%s", line)
		out = append(append(out, line...), '\n')
	}
	return os.WriteFile(path, out, 0o644)
}

func main() {
	log.SetFlags(0)
	if err := run(parseFlags()); err != nil {
		log.Fatalf("prefill: %v", err)
	}
}
