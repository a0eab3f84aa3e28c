package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"kvtier.dev/kvtier/cost"
)

func init() {
	register(command{name: "calc", summary: "reload or recompute? for a model, context length and link", run: runCalc})
}

// calcConfig is the calculator's parsed command line.
type calcConfig struct {
	scenario    cost.Scenario
	tier        string
	blockTokens int
	tokens      int
	prefix      int
	json        bool
	sweep       bool
	plotPath    string
	// cal is the calibration (--calibration, --prefill-samples), nil for
	// the presets; samples are --prefill-samples'; writeCal is
	// --write-calibration.
	cal      *cost.Calibration
	samples  []cost.PrefillSample
	writeCal string
}

func runCalc(args []string, stdout, stderr io.Writer) int {
	cfg, err := calcParse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvtier calc: %v\n", err)
		return 2
	}
	rep, err := calcBuildReport(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "kvtier calc: %v\n", err)
		return 2
	}
	if cfg.cal != nil {
		if rep.Calibration, err = calcCalibrationReport(cfg); err != nil {
			fmt.Fprintf(stderr, "kvtier calc: %v\n", err)
			return 2
		}
	}
	if cfg.writeCal != "" {
		if err := cfg.cal.WriteFile(cfg.writeCal); err != nil {
			fmt.Fprintf(stderr, "kvtier calc: --write-calibration %s: %v\n", cfg.writeCal, err)
			return 1
		}
	}
	if cfg.plotPath != "" {
		if err := calcPlot(cfg, rep, cfg.plotPath); err != nil {
			fmt.Fprintf(stderr, "kvtier calc: --plot %s: %v\n", cfg.plotPath, err)
			return 1
		}
	}
	if cfg.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "kvtier calc: %v\n", err)
			return 1
		}
		return 0
	}
	if rep.Calibration != nil {
		calcPrintCalibration(stdout, cfg, rep.Calibration)
	}
	calcPrint(stdout, cfg, rep)
	return 0
}

func calcParse(args []string, stderr io.Writer) (calcConfig, error) {
	fs := flag.NewFlagSet("kvtier calc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	model := fs.String("model", "llama-3.1-70b", "model preset: "+strings.Join(cost.ModelNames(), ", "))
	modelFile := fs.String("model-file", "", "custom model as JSON (keys: name, layers, q_heads, kv_heads, head_dim, dtype, total_params, active_params, kv_lora_rank, ...)")
	layers := fs.Int("layers", 0, "override: number of layers")
	qHeads := fs.Int("q-heads", 0, "override: query heads")
	kvHeads := fs.Int("kv-heads", 0, "override: key/value heads")
	headDim := fs.Int("head-dim", 0, "override: head dimension")
	dtype := fs.String("dtype", "", "override: KV dtype (bf16, fp16, fp8, fp32)")
	params := fs.Float64("params", 0, "override: total parameters (70e9 for a 70B model); active follows unless --active-params")
	activeParams := fs.Float64("active-params", 0, "override: active parameters per token (MoE)")
	tokens := fs.Int("tokens", 32768, "tokens of the cached prefix to bring back")
	prefix := fs.Int("prefix", 0, "tokens already on the GPU before them")
	gpu := fs.String("gpu", "h200", "GPU preset: "+strings.Join(cost.GPUNames(), ", "))
	link := fs.String("link", "pcie5-pinned", "the GPU's host link: "+strings.Join(cost.LinkNames(), ", "))
	tier := fs.String("tier", "host", "where the KV is: host (over --link), nvme (--nvme then --link), remote (--rdma then --link)")
	nvme := fs.String("nvme", "nvme-gen5", "NVMe drive preset for --tier nvme")
	drives := fs.Int("drives", 1, "NVMe drives striped together")
	serial := fs.Bool("serial", false, "two-hop paths do not overlap their hops (default: pipelined, the slower hop sets the rate)")
	rdma := fs.String("rdma", "rdma-400g", "network link preset for --tier remote")
	tp := fs.Int("tp", 0, "tensor-parallel degree; 0: the smallest power of two at which the weights and the request's KV fit in the GPU")
	blockTokens := fs.Int("block-tokens", 16, "tokens per KV block")
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	sweep := fs.Bool("sweep", false, "also sweep context lengths 64, 128, ... up to --tokens")
	plotPath := fs.String("plot", "", "with --sweep: draw reload, recompute and split time against context length (FILE.svg or FILE.png)")
	probe := fs.String("probe", "", "a `kvtier probe --json` file: its measured host link replaces --link's figures")
	bandwidth := fs.Float64("bandwidth", 0, "override --link's bandwidth, GB/s")
	latency := fs.Duration("latency", 0, "override --link's per-transfer latency (3us, 0)")
	tflops := fs.Float64("tflops", 0, "override the GPU's dense bf16 peak, TFLOP/s")
	efficiency := fs.Float64("efficiency", 0, "override the GPU's prefill efficiency, in (0, 1]")
	gpuMemory := fs.Float64("gpu-memory", 0, "override the GPU's memory, GB: the weights (per GPU) and the request's KV must fit in it")
	calPath := fs.String("calibration", "", "a calibration file (--write-calibration's, a server's) or `kvtier probe --json` output: its fitted prefill and links replace the presets")
	samplesPath := fs.String("prefill-samples", "", "fit prefill to measured samples, one JSON object a line: {\"model\":\"llama-3.1-8b\",\"prefix\":0,\"tokens\":512,\"seconds\":0.0222}; prints the fitted terms and each sample's error")
	writeCal := fs.String("write-calibration", "", "write the calibration (--calibration, then --prefill-samples) to this file as JSON")
	if err := fs.Parse(args); err != nil {
		return calcConfig{}, err
	}
	if fs.NArg() > 0 {
		return calcConfig{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// Every number a user set must be positive: a zero would be silently
	// read as "keep the preset" otherwise.
	for _, c := range []struct {
		name string
		bad  bool
	}{
		{"layers", *layers <= 0}, {"q-heads", *qHeads <= 0}, {"kv-heads", *kvHeads <= 0}, {"head-dim", *headDim <= 0},
		{"params", !(*params > 0)}, {"active-params", !(*activeParams > 0)},
		{"bandwidth", !(*bandwidth > 0)}, {"latency", *latency < 0},
		{"tflops", !(*tflops > 0)}, {"efficiency", !(*efficiency > 0)}, {"gpu-memory", !(*gpuMemory > 0)},
	} {
		if set[c.name] && c.bad {
			v := fs.Lookup(c.name).Value.String()
			return calcConfig{}, fmt.Errorf("--%s %s: must be positive", c.name, v)
		}
	}

	cfg := calcConfig{tier: *tier, blockTokens: *blockTokens, tokens: *tokens, prefix: *prefix,
		json: *jsonOut, sweep: *sweep, plotPath: *plotPath}
	s := &cfg.scenario
	var err error
	if *modelFile != "" {
		if set["model"] {
			return calcConfig{}, errors.New("--model and --model-file: give one")
		}
		s.Model, err = cost.LoadModelFile(*modelFile)
	} else {
		s.Model, err = cost.LookupModel(*model)
	}
	if err != nil {
		return calcConfig{}, err
	}
	if set["layers"] {
		s.Model.Layers = *layers
	}
	if set["q-heads"] {
		s.Model.QHeads = *qHeads
	}
	if set["kv-heads"] {
		s.Model.KVHeads = *kvHeads
	}
	if set["head-dim"] {
		s.Model.HeadDim = *headDim
	}
	if set["dtype"] {
		if s.Model.Dtype, err = cost.ParseDtype(*dtype); err != nil {
			return calcConfig{}, err
		}
	}
	if set["params"] {
		// A dense model's active count follows its total; a mixture of
		// experts keeps its active count unless --active-params says.
		dense := s.Model.ActiveParams == s.Model.TotalParams
		s.Model.TotalParams = *params
		if dense && !set["active-params"] {
			s.Model.ActiveParams = *params
		}
	}
	if set["active-params"] {
		s.Model.ActiveParams = *activeParams
	}
	for _, f := range []string{"layers", "q-heads", "kv-heads", "head-dim", "dtype", "params", "active-params"} {
		if set[f] {
			s.Model.Name += "+overrides"
			break
		}
	}

	if s.GPU, err = cost.LookupGPU(*gpu); err != nil {
		return calcConfig{}, err
	}
	if set["tflops"] {
		s.GPU.PeakFLOPS = *tflops * 1e12
	}
	if set["efficiency"] {
		s.GPU.Efficiency = *efficiency
	}
	if set["gpu-memory"] {
		s.GPU.MemoryBytes = int64(*gpuMemory * 1e9)
	}
	s.TP = *tp
	autoTP := !set["tp"] || *tp == 0
	if autoTP {
		s.TP = 1
	}

	cfg.writeCal = *writeCal
	if cfg.cal, cfg.samples, err = calcLoadCalibration(s, *calPath, *samplesPath, *writeCal != ""); err != nil {
		return calcConfig{}, err
	}
	var fit *cost.Fit
	if cfg.cal != nil {
		fit = cfg.cal.Current()
		s.Fit = fit
	}
	ingress, err := cost.LookupLink(*link)
	if err != nil {
		return calcConfig{}, err
	}
	ingress, _ = fit.Link(ingress)
	if *probe != "" {
		p, err := cost.LoadProbe(*probe)
		if err != nil {
			return calcConfig{}, err
		}
		ingress = p.Pinned
		if strings.Contains(*link, "pageable") {
			if p.Pageable.BandwidthBytesPerS == 0 {
				return calcConfig{}, fmt.Errorf("--probe %s: no pageable figure for --link %s", *probe, *link)
			}
			ingress = p.Pageable
		}
	}
	if set["bandwidth"] {
		ingress.BandwidthBytesPerS = *bandwidth * 1e9
	}
	if set["latency"] {
		ingress.Latency = *latency
	}
	switch *tier {
	case "host":
		s.Path = cost.DirectPath(ingress)
	case "nvme":
		src, err := cost.LookupLink(*nvme)
		if err != nil {
			return calcConfig{}, err
		}
		src, _ = fit.Link(src)
		if src, err = src.Drives(*drives); err != nil {
			return calcConfig{}, err
		}
		s.Path = cost.Path{Source: src, Ingress: ingress, Pipelined: !*serial}
	case "remote":
		src, err := cost.LookupLink(*rdma)
		if err != nil {
			return calcConfig{}, err
		}
		s.Path = cost.Path{Source: src, Ingress: ingress, Pipelined: !*serial}
	default:
		return calcConfig{}, fmt.Errorf("--tier %q: %w; known: host, nvme, remote", *tier, cost.ErrUnknownName)
	}
	if err := s.Validate(); err != nil {
		return calcConfig{}, err
	}
	if cfg.blockTokens < 1 || cfg.blockTokens > 1<<20 {
		return calcConfig{}, fmt.Errorf("--block-tokens %d: must be between 1 and %d", cfg.blockTokens, 1<<20)
	}
	if cfg.plotPath != "" {
		if !cfg.sweep {
			return calcConfig{}, errors.New("--plot needs --sweep")
		}
		if ext := strings.ToLower(filepath.Ext(cfg.plotPath)); ext != ".svg" && ext != ".png" {
			return calcConfig{}, fmt.Errorf("--plot %s: the file must end in .svg or .png", cfg.plotPath)
		}
	}
	if cfg.sweep && cfg.tokens < 64 {
		return calcConfig{}, fmt.Errorf("--sweep needs --tokens of at least 64, got %d", cfg.tokens)
	}
	// Decide checks tokens and prefix; do it now so that a bad value is a
	// usage error, whatever the output.
	if _, err := s.Decide(cfg.tokens, cfg.prefix); err != nil {
		return calcConfig{}, err
	}
	// The request's KV (prefix and tokens) must fit beside the weights;
	// without --tp, at the smallest power-of-two degree where it does.
	for {
		kv := s.Model.KVBytesPerTokenPerRank(s.TP) * int64(cfg.prefix+cfg.tokens)
		err := s.CheckFits(kv)
		if err == nil {
			break
		}
		if !autoTP || s.TP >= 64 {
			return calcConfig{}, fmt.Errorf("--model %s --gpu %s --tp %d with %d tokens: %w", s.Model.Name, s.GPU.Name, s.TP, cfg.prefix+cfg.tokens, err)
		}
		s.TP *= 2
	}
	return cfg, nil
}

// calcReport is what the calculator prints; its JSON form is --json's.
type calcReport struct {
	Model                     calcModel      `json:"model"`
	GPU                       calcGPU        `json:"gpu"`
	TP                        int            `json:"tp"`
	Tier                      string         `json:"tier"`
	Path                      string         `json:"path"`
	Tokens                    int            `json:"tokens"`
	Prefix                    int            `json:"prefix"`
	BlockTokens               int            `json:"block_tokens"`
	KVBytesPerToken           int64          `json:"kv_bytes_per_token"`
	KVBytesPerBlock           int64          `json:"kv_bytes_per_block"`
	KVBytes                   int64          `json:"kv_bytes"`
	KVBytesPerGPU             int64          `json:"kv_bytes_per_gpu"`
	ReloadSeconds             float64        `json:"reload_seconds"`
	RecomputeLinearSeconds    float64        `json:"recompute_linear_seconds"`
	RecomputeAttentionSeconds float64        `json:"recompute_attention_seconds"`
	Decision                  string         `json:"decision"`
	SplitRecomputeTokens      int            `json:"split_recompute_tokens"`
	SplitLoadTokens           int            `json:"split_load_tokens"`
	SplitSeconds              float64        `json:"split_seconds"`
	BreakEvenTokens           *int           `json:"break_even_tokens"`        // with attention; null: reload never wins
	BreakEvenLinearTokens     *int           `json:"break_even_linear_tokens"` // linear-only recompute
	ReloadPerLink             []calcLink     `json:"reload_per_link"`
	Sweep                     []calcSweepRow `json:"sweep,omitempty"`
	// Calibration: with --calibration or --prefill-samples.
	Calibration *calcCalibration `json:"calibration,omitempty"`
}

type calcModel struct {
	Name         string  `json:"name"`
	Layers       int     `json:"layers"`
	QHeads       int     `json:"q_heads"`
	KVHeads      int     `json:"kv_heads,omitempty"`
	HeadDim      int     `json:"head_dim,omitempty"`
	KVLoraRank   int     `json:"kv_lora_rank,omitempty"`
	RopeHeadDim  int     `json:"qk_rope_head_dim,omitempty"`
	Dtype        string  `json:"dtype"`
	TotalParams  float64 `json:"total_params"`
	ActiveParams float64 `json:"active_params"`
}

type calcGPU struct {
	Name           string  `json:"name"`
	PeakFLOPS      float64 `json:"peak_flops"`
	Efficiency     float64 `json:"efficiency"`
	EffectiveFLOPS float64 `json:"effective_flops"`
}

type calcLink struct {
	Link               string  `json:"link"`
	BandwidthBytesPerS float64 `json:"bandwidth_bytes_per_s"`
	LatencySeconds     float64 `json:"latency_seconds"`
	ReloadSeconds      float64 `json:"reload_seconds"`
}

type calcSweepRow struct {
	Tokens                    int     `json:"tokens"`
	KVBytes                   int64   `json:"kv_bytes"`
	ReloadSeconds             float64 `json:"reload_seconds"`
	RecomputeLinearSeconds    float64 `json:"recompute_linear_seconds"`
	RecomputeAttentionSeconds float64 `json:"recompute_attention_seconds"`
	SplitSeconds              float64 `json:"split_seconds"`
	SplitRecomputeTokens      int     `json:"split_recompute_tokens"`
	Decision                  string  `json:"decision"`
	// ReloadPerLinkSeconds follows the order of the report's reload_per_link.
	ReloadPerLinkSeconds []float64 `json:"reload_per_link_seconds"`
}

func calcBuildReport(cfg calcConfig) (*calcReport, error) {
	s := &cfg.scenario
	d, err := s.Decide(cfg.tokens, cfg.prefix)
	if err != nil {
		return nil, err
	}
	m := &s.Model
	r := &calcReport{
		Model: calcModel{Name: m.Name, Layers: m.Layers, QHeads: m.QHeads, Dtype: m.Dtype.String(),
			TotalParams: m.TotalParams, ActiveParams: m.ActiveParams},
		GPU: calcGPU{Name: s.GPU.Name, PeakFLOPS: s.GPU.PeakFLOPS, Efficiency: s.GPU.Efficiency, EffectiveFLOPS: s.GPU.EffectiveFLOPS()},
		TP:  s.TP, Tier: cfg.tier, Path: s.Path.Name(),
		Tokens: cfg.tokens, Prefix: cfg.prefix, BlockTokens: cfg.blockTokens,
		KVBytesPerToken: m.KVBytesPerToken(), KVBytesPerBlock: m.KVBytesPerBlock(cfg.blockTokens),
		KVBytes: d.KVBytes, KVBytesPerGPU: m.KVBytesPerTokenPerRank(s.TP) * int64(cfg.tokens),
		ReloadSeconds: d.Reload.Seconds(), RecomputeLinearSeconds: d.RecomputeLinear.Seconds(),
		RecomputeAttentionSeconds: d.RecomputeWithAttention.Seconds(), Decision: d.Choice.String(),
		SplitRecomputeTokens: d.Split.RecomputeTokens, SplitLoadTokens: d.Split.LoadTokens, SplitSeconds: d.Split.Time.Seconds(),
	}
	if m.IsMLA() {
		r.Model.KVLoraRank, r.Model.RopeHeadDim = m.KVLoraRank, m.QKRopeHeadDim
	} else {
		r.Model.KVHeads, r.Model.HeadDim = m.KVHeads, m.HeadDim
	}
	if n, ok := s.BreakEven(true); ok {
		r.BreakEvenTokens = &n
	}
	if n, ok := s.BreakEven(false); ok {
		r.BreakEvenLinearTokens = &n
	}
	links := calcLinks()
	for _, l := range links {
		one := *s
		one.Path = cost.DirectPath(l)
		r.ReloadPerLink = append(r.ReloadPerLink, calcLink{Link: l.Name, BandwidthBytesPerS: l.BandwidthBytesPerS,
			LatencySeconds: l.Latency.Seconds(), ReloadSeconds: one.ReloadTime(cfg.tokens).Seconds()})
	}
	if cfg.sweep {
		for _, n := range calcSweepTokens(cfg.tokens) {
			sd, err := s.Decide(n, cfg.prefix)
			if err != nil {
				return nil, err
			}
			row := calcSweepRow{Tokens: n, KVBytes: sd.KVBytes, ReloadSeconds: sd.Reload.Seconds(),
				RecomputeLinearSeconds: sd.RecomputeLinear.Seconds(), RecomputeAttentionSeconds: sd.RecomputeWithAttention.Seconds(),
				SplitSeconds: sd.Split.Time.Seconds(), SplitRecomputeTokens: sd.Split.RecomputeTokens, Decision: sd.Choice.String()}
			for _, l := range links {
				one := *s
				one.Path = cost.DirectPath(l)
				row.ReloadPerLinkSeconds = append(row.ReloadPerLinkSeconds, one.ReloadTime(n).Seconds())
			}
			r.Sweep = append(r.Sweep, row)
		}
	}
	return r, nil
}

// calcLinks is every link preset, each taken alone as the path.
func calcLinks() []cost.Link {
	var links []cost.Link
	for _, name := range cost.LinkNames() {
		l, _ := cost.LookupLink(name)
		links = append(links, l)
	}
	return links
}

// calcSweepTokens is 64, 128, ... (powers of two) up to max, and max.
func calcSweepTokens(max int) []int {
	var out []int
	for n := 64; n < max; n *= 2 {
		out = append(out, n)
	}
	return append(out, max)
}

func calcPrint(w io.Writer, cfg calcConfig, r *calcReport) {
	s := &cfg.scenario
	m := &s.Model
	attn := fmt.Sprintf("%d query heads, %d KV heads × %d", m.QHeads, m.KVHeads, m.HeadDim)
	if m.IsMLA() {
		attn = fmt.Sprintf("%d query heads, MLA latent %d + rope %d", m.QHeads, m.KVLoraRank, m.QKRopeHeadDim)
	}
	fmt.Fprintf(w, "model      %s: %d layers, %s, %s, %s params (%s active)\n",
		m.Name, m.Layers, attn, m.Dtype, calcCount(m.TotalParams), calcCount(m.ActiveParams))
	fmt.Fprintf(w, "KV         %s bytes/token, %s bytes/block of %d tokens\n",
		calcInt(r.KVBytesPerToken), calcInt(r.KVBytesPerBlock), r.BlockTokens)
	fmt.Fprintf(w, "           %s tokens = %s bytes (%.2f GB, %.2f GiB); per GPU at TP %d: %.2f GB\n",
		calcInt(int64(r.Tokens)), calcInt(r.KVBytes), float64(r.KVBytes)/1e9, float64(r.KVBytes)/(1<<30), r.TP, float64(r.KVBytesPerGPU)/1e9)
	fmt.Fprintf(w, "GPU        %s: %.0f TFLOP/s dense bf16 × %.2f = %.0f TFLOP/s effective, TP %d\n",
		s.GPU.Name, s.GPU.PeakFLOPS/1e12, s.GPU.Efficiency, s.GPU.EffectiveFLOPS()/1e12, s.TP)
	fmt.Fprintf(w, "tier       %s via %s\n\n", r.Tier, r.Path)

	fmt.Fprintf(w, "reload of %s tokens over each link alone (each GPU its own shard over its own link):\n", calcInt(int64(r.Tokens)))
	for _, l := range r.ReloadPerLink {
		fmt.Fprintf(w, "  %-18s %7.1f GB/s  %6s  %10s\n", l.Link, l.BandwidthBytesPerS/1e9,
			calcDur(l.LatencySeconds), calcDur(l.ReloadSeconds))
	}
	fmt.Fprintf(w, "  %-18s %27s  %10s\n\n", "this tier's path", r.Path, calcDur(r.ReloadSeconds))

	fmt.Fprintf(w, "recompute of %s tokens after %s present:\n", calcInt(int64(r.Tokens)), calcInt(int64(r.Prefix)))
	fmt.Fprintf(w, "  linear only (2 × active params × tokens)      %10s\n", calcDur(r.RecomputeLinearSeconds))
	fmt.Fprintf(w, "  with causal attention (used for decisions)    %10s\n\n", calcDur(r.RecomputeAttentionSeconds))

	win, lose := r.ReloadSeconds, r.RecomputeAttentionSeconds
	if r.Decision == "recompute" {
		win, lose = lose, win
	}
	fmt.Fprintf(w, "decision   %s: %s against %s (%.1fx)\n", r.Decision, calcDur(win), calcDur(lose), lose/win)
	fmt.Fprintf(w, "best split recompute the first %s tokens while %s load: %s (%.2fx faster than %s alone)\n",
		calcInt(int64(r.SplitRecomputeTokens)), calcInt(int64(r.SplitLoadTokens)), calcDur(r.SplitSeconds), win/r.SplitSeconds, r.Decision)
	fmt.Fprintf(w, "break-even reload wins from %s (recompute with attention), %s (linear only)\n",
		calcTokensOrNever(r.BreakEvenTokens), calcTokensOrNever(r.BreakEvenLinearTokens))

	if len(r.Sweep) > 0 {
		fmt.Fprintf(w, "\nsweep over context length (recompute with attention unless marked linear):\n")
		fmt.Fprintf(w, "  %10s %14s %10s %12s %10s %10s %10s\n", "tokens", "KV bytes", "reload", "rec.linear", "recompute", "split", "decision")
		for _, row := range r.Sweep {
			fmt.Fprintf(w, "  %10s %14s %10s %12s %10s %10s %10s\n", calcInt(int64(row.Tokens)), calcInt(row.KVBytes),
				calcDur(row.ReloadSeconds), calcDur(row.RecomputeLinearSeconds), calcDur(row.RecomputeAttentionSeconds),
				calcDur(row.SplitSeconds), row.Decision)
		}
	}
	if cfg.plotPath != "" {
		fmt.Fprintf(w, "\nplot written to %s\n", cfg.plotPath)
	}
}

func calcTokensOrNever(n *int) string {
	if n == nil {
		return "never"
	}
	if *n == 1 {
		return "1 token"
	}
	return calcInt(int64(*n)) + " tokens"
}

// calcInt writes n with thousands separators: 327,680.
func calcInt(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// calcCount writes a parameter count: 70.6B, 12.9B, 671B.
func calcCount(n float64) string {
	switch {
	case n >= 1e9:
		return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.1f", n/1e9), "0"), ".") + "B"
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", n/1e6)
	}
	return fmt.Sprintf("%.0f", n)
}

// calcDur writes seconds the way a person reads them: 3us, 214.7ms, 7.65s.
func calcDur(sec float64) string {
	switch {
	case sec == 0:
		return "0"
	case sec < 1e-3:
		return fmt.Sprintf("%.1fus", sec*1e6)
	case sec < 1:
		return fmt.Sprintf("%.1fms", sec*1e3)
	}
	return fmt.Sprintf("%.2fs", sec)
}

// calcPlot draws the sweep: time against context length, log-log, one line
// for recompute (linear and with attention), the best split, this tier's
// reload and each host-link preset's reload.
func calcPlot(cfg calcConfig, r *calcReport, path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s on %s, TP %d: reload or recompute", r.Model.Name, r.GPU.Name, r.TP)
	p.X.Label.Text = "context length (tokens)"
	p.Y.Label.Text = "time (s)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	series := func(f func(calcSweepRow) float64) plotter.XYs {
		xy := make(plotter.XYs, len(r.Sweep))
		for i, row := range r.Sweep {
			xy[i].X, xy[i].Y = float64(row.Tokens), f(row)
		}
		return xy
	}
	lines := []any{
		"recompute (with attention)", series(func(x calcSweepRow) float64 { return x.RecomputeAttentionSeconds }),
		"recompute (linear only)", series(func(x calcSweepRow) float64 { return x.RecomputeLinearSeconds }),
		"best split", series(func(x calcSweepRow) float64 { return x.SplitSeconds }),
		"reload over this tier's path (" + r.Path + ")", series(func(x calcSweepRow) float64 { return x.ReloadSeconds }),
	}
	for i, l := range r.ReloadPerLink {
		if strings.HasSuffix(l.Link, "-pageable") || l.Link == "nvlink-c2c-gb200" {
			continue // same figure as another line, or off the useful range
		}
		lines = append(lines, "reload: "+l.Link+" preset", series(func(x calcSweepRow) float64 { return x.ReloadPerLinkSeconds[i] }))
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return err
	}
	for _, row := range r.Sweep {
		for _, v := range append([]float64{row.ReloadSeconds, row.RecomputeLinearSeconds, row.SplitSeconds}, row.ReloadPerLinkSeconds...) {
			if !(v > 0) || math.IsInf(v, 0) {
				return fmt.Errorf("cannot plot %g s on a log scale (tokens %d)", v, row.Tokens)
			}
		}
	}
	return p.Save(9*vg.Inch, 6*vg.Inch, path)
}
