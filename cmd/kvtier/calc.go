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
	"time"

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
	codec    cost.Codec // --codec's; zero: none
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

// calcFlags are calc's flags as given, before they are checked and turned
// into a scenario.
type calcFlags struct {
	model, modelFile                 string
	layers, qHeads, kvHeads, headDim int
	dtype                            string
	params, activeParams             float64
	tokens, prefix                   int
	gpu, link, tier, nvme, rdma      string
	drives                           int
	serial                           bool
	tp, blockTokens                  int
	json, sweep                      bool
	plotPath, probe                  string
	bandwidth                        float64
	latency                          time.Duration
	tflops, efficiency, gpuMemory    float64
	calPath, samplesPath, writeCal   string
	codec                            string
	// set holds the flags given on the command line.
	set map[string]bool
}

// calcFlagSet defines calc's flags into f.
func calcFlagSet(f *calcFlags, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvtier calc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.model, "model", "llama-3.1-70b", "model preset: "+strings.Join(cost.ModelNames(), ", "))
	fs.StringVar(&f.modelFile, "model-file", "", "custom model as JSON (keys: name, layers, q_heads, kv_heads, head_dim, dtype, total_params, active_params, kv_lora_rank, ...)")
	fs.IntVar(&f.layers, "layers", 0, "override: number of layers")
	fs.IntVar(&f.qHeads, "q-heads", 0, "override: query heads")
	fs.IntVar(&f.kvHeads, "kv-heads", 0, "override: key/value heads")
	fs.IntVar(&f.headDim, "head-dim", 0, "override: head dimension")
	fs.StringVar(&f.dtype, "dtype", "", "override: KV dtype (bf16, fp16, fp8, fp32)")
	fs.Float64Var(&f.params, "params", 0, "override: total parameters (70e9 for a 70B model); active follows unless --active-params")
	fs.Float64Var(&f.activeParams, "active-params", 0, "override: active parameters per token (MoE)")
	fs.IntVar(&f.tokens, "tokens", 32768, "tokens of the cached prefix to bring back")
	fs.IntVar(&f.prefix, "prefix", 0, "tokens already on the GPU before them")
	fs.StringVar(&f.gpu, "gpu", "h200", "GPU preset: "+strings.Join(cost.GPUNames(), ", "))
	fs.StringVar(&f.link, "link", "pcie5-pinned", "the GPU's host link: "+strings.Join(cost.LinkNames(), ", "))
	fs.StringVar(&f.tier, "tier", "host", "where the KV is: host (over --link), nvme (--nvme then --link), remote (--rdma then --link)")
	fs.StringVar(&f.nvme, "nvme", "nvme-gen5", "NVMe drive preset for --tier nvme")
	fs.IntVar(&f.drives, "drives", 1, "NVMe drives striped together")
	fs.BoolVar(&f.serial, "serial", false, "two-hop paths do not overlap their hops (default: pipelined, the slower hop sets the rate)")
	fs.StringVar(&f.rdma, "rdma", "rdma-400g", "network link preset for --tier remote")
	fs.IntVar(&f.tp, "tp", 0, "tensor-parallel degree; 0: the smallest power of two at which the weights and the request's KV fit in the GPU")
	fs.IntVar(&f.blockTokens, "block-tokens", 16, "tokens per KV block")
	fs.BoolVar(&f.json, "json", false, "print the report as JSON")
	fs.BoolVar(&f.sweep, "sweep", false, "also sweep context lengths 64, 128, ... up to --tokens")
	fs.StringVar(&f.plotPath, "plot", "", "with --sweep: draw reload, recompute and split time against context length (FILE.svg or FILE.png)")
	fs.StringVar(&f.probe, "probe", "", "a `kvtier probe --json` file: its measured host link replaces --link's figures")
	fs.Float64Var(&f.bandwidth, "bandwidth", 0, "override --link's bandwidth, GB/s")
	fs.DurationVar(&f.latency, "latency", 0, "override --link's per-transfer latency (3us, 0)")
	fs.Float64Var(&f.tflops, "tflops", 0, "override the GPU's dense bf16 peak, TFLOP/s")
	fs.Float64Var(&f.efficiency, "efficiency", 0, "override the GPU's prefill efficiency, in (0, 1]")
	fs.Float64Var(&f.gpuMemory, "gpu-memory", 0, "override the GPU's memory, GB: the weights (per GPU) and the request's KV must fit in it")
	fs.StringVar(&f.calPath, "calibration", "", "a calibration file (--write-calibration's, a server's) or `kvtier probe --json` output: its fitted prefill and links replace the presets")
	fs.StringVar(&f.samplesPath, "prefill-samples", "", "fit prefill to measured samples, one JSON object a line: {\"model\":\"llama-3.1-8b\",\"prefix\":0,\"tokens\":512,\"seconds\":0.0222}; prints the fitted terms and each sample's error")
	fs.StringVar(&f.codec, "codec", "", calcCodecFlag())
	fs.StringVar(&f.writeCal, "write-calibration", "", "write the calibration (--calibration, then --prefill-samples) to this file as JSON")
	return fs
}

// calcParse parses the command line into the scenario and the report's
// options, checked: a bad value is an error naming its flag.
func calcParse(args []string, stderr io.Writer) (calcConfig, error) {
	var f calcFlags
	fs := calcFlagSet(&f, stderr)
	if err := fs.Parse(args); err != nil {
		return calcConfig{}, err
	}
	if fs.NArg() > 0 {
		return calcConfig{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	if err := f.checkPositive(fs); err != nil {
		return calcConfig{}, err
	}
	cfg := calcConfig{tier: f.tier, blockTokens: f.blockTokens, tokens: f.tokens, prefix: f.prefix,
		json: f.json, sweep: f.sweep, plotPath: f.plotPath, writeCal: f.writeCal}
	autoTP, err := f.scenario(&cfg)
	if err != nil {
		return calcConfig{}, err
	}
	if cfg.codec, err = calcLookupCodec(f.codec); err != nil {
		return calcConfig{}, err
	}
	if err := cfg.check(); err != nil {
		return calcConfig{}, err
	}
	if err := cfg.fitTP(autoTP); err != nil {
		return calcConfig{}, err
	}
	if err := cfg.checkCodec(); err != nil {
		return calcConfig{}, err
	}
	return cfg, nil
}

// checkPositive fails on a number given on the command line that is not
// positive: a zero would be silently read as "keep the preset" otherwise.
func (f *calcFlags) checkPositive(fs *flag.FlagSet) error {
	for _, c := range []struct {
		name string
		bad  bool
	}{
		{"layers", f.layers <= 0}, {"q-heads", f.qHeads <= 0}, {"kv-heads", f.kvHeads <= 0}, {"head-dim", f.headDim <= 0},
		{"params", !(f.params > 0)}, {"active-params", !(f.activeParams > 0)},
		{"bandwidth", !(f.bandwidth > 0)}, {"latency", f.latency < 0},
		{"tflops", !(f.tflops > 0)}, {"efficiency", !(f.efficiency > 0)}, {"gpu-memory", !(f.gpuMemory > 0)},
	} {
		if f.set[c.name] && c.bad {
			v := fs.Lookup(c.name).Value.String()
			return fmt.Errorf("--%s %s: must be positive", c.name, v)
		}
	}
	return nil
}

// scenario builds cfg's scenario (model, GPU, calibration, path) and its
// calibration from the flags. autoTP is whether the degree is left to
// fitTP (no --tp, or --tp 0); s.TP is then 1.
func (f *calcFlags) scenario(cfg *calcConfig) (autoTP bool, err error) {
	s := &cfg.scenario
	if s.Model, err = f.buildModel(); err != nil {
		return false, err
	}
	if s.GPU, err = f.buildGPU(); err != nil {
		return false, err
	}
	s.TP = f.tp
	autoTP = !f.set["tp"] || f.tp == 0
	if autoTP {
		s.TP = 1
	}
	if cfg.cal, cfg.samples, err = calcLoadCalibration(s, f.calPath, f.samplesPath, f.writeCal != ""); err != nil {
		return false, err
	}
	var fit *cost.Fit
	if cfg.cal != nil {
		fit = cfg.cal.Current()
		s.Fit = fit
	}
	ingress, err := f.ingress(fit)
	if err != nil {
		return false, err
	}
	if s.Path, err = f.path(fit, ingress); err != nil {
		return false, err
	}
	return autoTP, nil
}

// buildModel is --model's preset or --model-file's model, with the
// overrides given (its name then ends in "+overrides").
func (f *calcFlags) buildModel() (cost.Model, error) {
	var m cost.Model
	var err error
	if f.modelFile != "" {
		if f.set["model"] {
			return m, errors.New("--model and --model-file: give one")
		}
		m, err = cost.LoadModelFile(f.modelFile)
	} else {
		m, err = cost.LookupModel(f.model)
	}
	if err != nil {
		return m, err
	}
	if f.set["layers"] {
		m.Layers = f.layers
	}
	if f.set["q-heads"] {
		m.QHeads = f.qHeads
	}
	if f.set["kv-heads"] {
		m.KVHeads = f.kvHeads
	}
	if f.set["head-dim"] {
		m.HeadDim = f.headDim
	}
	if f.set["dtype"] {
		if m.Dtype, err = cost.ParseDtype(f.dtype); err != nil {
			return m, err
		}
	}
	if f.set["params"] {
		// A dense model's active count follows its total; a mixture of
		// experts keeps its active count unless --active-params says.
		dense := m.ActiveParams == m.TotalParams
		m.TotalParams = f.params
		if dense && !f.set["active-params"] {
			m.ActiveParams = f.params
		}
	}
	if f.set["active-params"] {
		m.ActiveParams = f.activeParams
	}
	for _, name := range []string{"layers", "q-heads", "kv-heads", "head-dim", "dtype", "params", "active-params"} {
		if f.set[name] {
			m.Name += "+overrides"
			break
		}
	}
	return m, nil
}

// buildGPU is --gpu's preset with the overrides given.
func (f *calcFlags) buildGPU() (cost.GPU, error) {
	g, err := cost.LookupGPU(f.gpu)
	if err != nil {
		return g, err
	}
	if f.set["tflops"] {
		g.PeakFLOPS = f.tflops * 1e12
	}
	if f.set["efficiency"] {
		g.Efficiency = f.efficiency
	}
	if f.set["gpu-memory"] {
		g.MemoryBytes = int64(f.gpuMemory * 1e9)
	}
	return g, nil
}

// ingress is the GPU's host link: --link's preset as fit calibrated it,
// or what --probe measured, with --bandwidth and --latency over it.
func (f *calcFlags) ingress(fit *cost.Fit) (cost.Link, error) {
	ingress, err := cost.LookupLink(f.link)
	if err != nil {
		return cost.Link{}, err
	}
	ingress, _ = fit.Link(ingress)
	if f.probe != "" {
		p, err := cost.LoadProbe(f.probe)
		if err != nil {
			return cost.Link{}, err
		}
		ingress = p.Pinned
		if strings.Contains(f.link, "pageable") {
			if p.Pageable.BandwidthBytesPerS == 0 {
				return cost.Link{}, fmt.Errorf("--probe %s: no pageable figure for --link %s", f.probe, f.link)
			}
			ingress = p.Pageable
		}
	}
	if f.set["bandwidth"] {
		ingress.BandwidthBytesPerS = f.bandwidth * 1e9
	}
	if f.set["latency"] {
		ingress.Latency = f.latency
	}
	return ingress, nil
}

// path is --tier's path to the GPU, ending in ingress.
func (f *calcFlags) path(fit *cost.Fit, ingress cost.Link) (cost.Path, error) {
	switch f.tier {
	case "host":
		return cost.DirectPath(ingress), nil
	case "nvme":
		src, err := cost.LookupLink(f.nvme)
		if err != nil {
			return cost.Path{}, err
		}
		src, _ = fit.Link(src)
		if src, err = src.Drives(f.drives); err != nil {
			return cost.Path{}, err
		}
		return cost.Path{Source: src, Ingress: ingress, Pipelined: !f.serial}, nil
	case "remote":
		src, err := cost.LookupLink(f.rdma)
		if err != nil {
			return cost.Path{}, err
		}
		return cost.Path{Source: src, Ingress: ingress, Pipelined: !f.serial}, nil
	default:
		return cost.Path{}, fmt.Errorf("--tier %q: %w; known: host, nvme, remote", f.tier, cost.ErrUnknownName)
	}
}

// check validates the scenario and the report's options.
func (cfg *calcConfig) check() error {
	s := &cfg.scenario
	if err := s.Validate(); err != nil {
		return err
	}
	if cfg.blockTokens < 1 || cfg.blockTokens > 1<<20 {
		return fmt.Errorf("--block-tokens %d: must be between 1 and %d", cfg.blockTokens, 1<<20)
	}
	if cfg.plotPath != "" {
		if !cfg.sweep {
			return errors.New("--plot needs --sweep")
		}
		if ext := strings.ToLower(filepath.Ext(cfg.plotPath)); ext != ".svg" && ext != ".png" {
			return fmt.Errorf("--plot %s: the file must end in .svg or .png", cfg.plotPath)
		}
	}
	if cfg.sweep && cfg.tokens < 64 {
		return fmt.Errorf("--sweep needs --tokens of at least 64, got %d", cfg.tokens)
	}
	// Decide checks tokens and prefix; do it now so that a bad value is a
	// usage error, whatever the output.
	_, err := s.Decide(cfg.tokens, cfg.prefix)
	return err
}

// fitTP checks that the request's KV (prefix and tokens) fits beside the
// weights; with autoTP it doubles the degree from 1 until it does, up to
// 64.
func (cfg *calcConfig) fitTP(autoTP bool) error {
	s := &cfg.scenario
	for {
		kv := s.Model.KVBytesPerTokenPerRank(s.TP) * int64(cfg.prefix+cfg.tokens)
		err := s.CheckFits(kv)
		if err == nil {
			return nil
		}
		if !autoTP || s.TP >= 64 {
			return fmt.Errorf("--model %s --gpu %s --tp %d with %d tokens: %w", s.Model.Name, s.GPU.Name, s.TP, cfg.prefix+cfg.tokens, err)
		}
		s.TP *= 2
	}
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
	// Codec: with --codec, the same request with the tier compressed.
	Codec *calcCodec `json:"codec,omitempty"`
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
	if cfg.codec.Enabled() {
		if r.Codec, err = calcCodecReport(cfg); err != nil {
			return nil, err
		}
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
	if r.Codec != nil {
		calcPrintCodec(w, r)
	}

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
