package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/schollz/progressbar/v3"

	"kvtier.dev/internal/replayplot"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/replay"
	"kvtier.dev/kvtier/trace"
)

func init() {
	register(command{name: "replay", summary: "replay a request trace through the block manager and compare strategies", run: runReplay})
}

// replayArgs is the replay's parsed command line.
type replayArgs struct {
	src       replay.Source
	cfg       replay.Config
	json      bool
	plotDir   string
	sweepHost []replay.Bytes
	// sweepRemote and remoteLink: --remote's sizes, read over the link
	// --remote-link measured.
	sweepRemote []replay.Bytes
	remoteLink  cost.Link
	progress    string
	// cpuProfile is a file for a CPU profile of the replay ("" for none).
	cpuProfile string
	// requestsOut is a file for a JSON line per request and strategy
	// (replay.RequestRecord; "" for none).
	requestsOut string
}

func runReplay(args []string, stdout, stderr io.Writer) int {
	a, err := replayParse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvtier replay: %v\n", err)
		return 2
	}
	if a.cpuProfile != "" {
		stop, err := startCPUProfile(a.cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "kvtier replay: --cpuprofile: %v\n", err)
			return 2
		}
		defer func() {
			if err := stop(); err != nil {
				fmt.Fprintf(stderr, "kvtier replay: --cpuprofile: %v\n", err)
			}
		}()
	}
	opts := replay.Options{SweepHost: a.sweepHost, SweepRemote: a.sweepRemote, RemoteLink: a.remoteLink}
	var records *requestsFile
	if a.requestsOut != "" {
		if records, err = createRequestsFile(a.requestsOut); err != nil {
			fmt.Fprintf(stderr, "kvtier replay: --requests-out: %v\n", err)
			return 2
		}
		defer records.f.Close() // after close, on an error
		opts.OnRequest = replay.RequestLines(records.w)
	}
	var bar *progressbar.ProgressBar
	if showProgress(a.progress, stderr) {
		bar = progressbar.NewOptions(-1, progressbar.OptionSetWriter(stderr), progressbar.OptionSetDescription("replaying"),
			progressbar.OptionShowCount(), progressbar.OptionSetItsString("req"), progressbar.OptionShowIts(),
			progressbar.OptionClearOnFinish())
		last := 0
		opts.Progress = func(s costplan.Strategy, n int) {
			if n < last {
				last = 0
			}
			bar.Describe("replaying (" + s.String() + ")")
			bar.Add(n - last)
			last = n
		}
	}
	rep, err := replay.Run(a.src, a.cfg, opts)
	if bar != nil {
		bar.Finish()
	}
	if err != nil && rep == nil {
		fmt.Fprintf(stderr, "kvtier replay: %v\n", err)
		var le *trace.LineError
		var ce *replay.ConfigError
		if errors.As(err, &le) || errors.As(err, &ce) {
			return 2
		}
		return 1
	}
	// With err, some strategies stopped over the memory budget: the
	// report of the others is printed all the same, then the error.
	if code := writeReplay(a, rep, records, stdout, stderr); code != 0 || err == nil {
		return code
	}
	fmt.Fprintf(stderr, "kvtier replay: %v\n", err)
	return 1
}

// writeReplay writes rep where a asks, and ends the requests file.
func writeReplay(a replayArgs, rep *replay.Report, records *requestsFile, stdout, stderr io.Writer) int {
	if records != nil {
		if err := records.close(); err != nil {
			fmt.Fprintf(stderr, "kvtier replay: --requests-out: %v\n", err)
			return 1
		}
	}
	if a.plotDir != "" {
		files, err := replayplot.Write(rep, a.plotDir)
		if err != nil {
			fmt.Fprintf(stderr, "kvtier replay: --plot %s: %v\n", a.plotDir, err)
			return 1
		}
		fmt.Fprintf(stderr, "kvtier replay: wrote %s\n", strings.Join(files, ", "))
	}
	var err error
	if a.json {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvtier replay: %v\n", err)
		return 1
	}
	return 0
}

// replayFlags are the replay's flags that are not Config fields.
type replayFlags struct {
	tracePath, generate, format string
	requests                    int
	rate                        float64 // --sessions-per-second
	seed                        uint64
	skipBad                     bool
	configPath                  string
	json                        bool
	plotDir                     string
	sweep                       string // --sweep-host
	remoteSizes, remoteLink     string
	progress                    string
	cpuProfile, requestsOut     string
}

// replayParse parses the command line: the flags over the defaults or the
// --config file, the trace to replay and the sweeps, checked.
func replayParse(args []string, stderr io.Writer) (replayArgs, error) {
	c := replay.DefaultConfig()
	var f replayFlags
	fs := replayFlagSet(&c, &f, stderr)
	if err := fs.Parse(args); err != nil {
		return replayArgs{}, err
	}
	if fs.NArg() > 0 {
		return replayArgs{}, fmt.Errorf("unexpected argument %q (the trace is --trace FILE)", fs.Arg(0))
	}
	a := replayArgs{cfg: c, json: f.json, plotDir: f.plotDir, progress: f.progress, cpuProfile: f.cpuProfile, requestsOut: f.requestsOut}
	switch f.progress {
	case "auto", "always", "never":
	default:
		return a, fmt.Errorf("--progress %q: want auto, always or never", f.progress)
	}
	if f.configPath != "" {
		fileCfg, err := replayConfigFile(f.configPath, fs, &c)
		if err != nil {
			return a, err
		}
		a.cfg = fileCfg
	}
	if err := a.cfg.Validate(); err != nil {
		return a, err
	}
	if a.plotDir != "" {
		if err := checkPlotDir(a.plotDir); err != nil {
			return a, fmt.Errorf("--plot %s: %w", a.plotDir, err)
		}
	}
	format, err := trace.ParseFormat(f.format)
	if err != nil {
		return a, err
	}
	if a.src, err = f.source(format); err != nil {
		return a, err
	}
	a.src.SkipBad = f.skipBad
	return a, f.sweeps(&a)
}

// replayFlagSet defines the replay's flags: c's fields, whose values are
// the defaults, and f's.
func replayFlagSet(c *replay.Config, f *replayFlags, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvtier replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { replayUsage(fs, stderr) }
	def := *c
	fs.StringVar(&f.tracePath, "trace", "", "trace file (JSONL, gzip-compressed or not); default: the bundled synthetic trace")
	fs.StringVar(&f.generate, "generate", "", "replay a generated trace instead: chat (the bundled trace's workload) or agentic (coding-agent sessions past 100K tokens, 64-token blocks)")
	fs.IntVar(&f.requests, "requests", 0, "with --generate: the requests to generate (default: the workload's, 3000 chat or 2000 agentic)")
	fs.Float64Var(&f.rate, "sessions-per-second", 0, "with --generate: new sessions per second (default: the workload's, 0.2 chat or 0.005 agentic)")
	fs.StringVar(&f.format, "format", "auto", "trace format: auto, mooncake or native")
	fs.BoolVar(&f.skipBad, "skip-bad", false, "skip malformed trace lines (counted in the report) instead of stopping at the first")
	fs.StringVar(&f.configPath, "config", "", "JSON config file (strict: unknown fields are errors)")
	fs.StringVar(&c.Model, "model", def.Model, "model preset: "+strings.Join(cost.ModelNames(), ", "))
	fs.StringVar(&c.GPU, "gpu", def.GPU, "GPU preset: "+strings.Join(cost.GPUNames(), ", "))
	fs.IntVar(&c.TP, "tp", def.TP, "tensor-parallel degree (tier sizes are per GPU)")
	fs.IntVar(&c.BlockTokens, "block-tokens", def.BlockTokens, "tokens per block; 0 takes the trace's (512 for Mooncake)")
	fs.Var(&c.GPUBytes, "gpu-kv", "GPU memory for the KV cache, e.g. 40GiB (it and the weights must fit in the GPU)")
	fs.IntVar(&c.MaxOutputTokens, "max-output-tokens", 0, "cap every request's output tokens, as kvtier bench-serve --max-tokens caps what it sends (0: the trace's)")
	fs.Var(&c.GPUMemoryBytes, "gpu-memory", "the GPU's memory, replacing the preset's (141GB for an H200), e.g. 94GB")
	fs.Var(&c.HostBytes, "host", "host tier capacity, e.g. 256GiB (0: none)")
	fs.Var(&c.NVMeBytes, "nvme", "NVMe tier capacity, e.g. 2TiB (0: none)")
	fs.StringVar(&c.HostLink, "host-link", def.HostLink, "host-GPU link preset: "+strings.Join(cost.LinkNames(), ", "))
	fs.StringVar(&c.NVMeLink, "nvme-link", def.NVMeLink, "the NVMe drive: a link preset (NAME-xN for N striped drives; writes at its read rate) or a file kvtier probe --nvme DIR --json FILE wrote (its measured read and write rates)")
	fs.StringVar(&c.Policy, "policy", def.Policy, "eviction policy: lru, s3fifo, 2q or cost-aware")
	fs.BoolVar(&c.WriteThrough, "write-through", def.WriteThrough, "copy blocks down as soon as they are ready (false: demote on eviction, write-back)")
	fs.StringVar(&c.NVMeAdmission, "nvme-admission", def.NVMeAdmission, "NVMe admission: all or seen-twice")
	fs.StringVar(&c.HostCodec, "host-codec", "", "how the host tier holds blocks: empty (as the GPU), a codec preset, "+strings.Join(cost.CodecNames(), ", ")+" (about half the bytes, coded on the GPU), or auto (the server's default: the codec the cost model says pays over --host-link within --codec-error-budget), as the server's -host-codec")
	fs.Func("codec-error-budget", fmt.Sprintf("with --host-codec auto: the largest relative RMS error of the KV a codec may add, as the server's -codec-error-budget (default %g)", cost.DefaultErrorBudget), func(v string) error {
		b, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return err
		}
		c.CodecErrorBudget = &b
		return nil
	})
	fs.StringVar(&c.NVMeCodec, "nvme-codec", "", "how the NVMe tier holds blocks, as --host-codec (the tiers that exist share one codec)")
	fs.StringVar(&c.RemoteCodec, "remote-codec", "", "how the remote tier holds blocks (default: the host tier's)")
	fs.StringVar(&c.NVMeWrites, "nvme-writes", "gated", "NVMe writes: gated (only blocks a load would be worth, within the drive's write budget, as a server writes them) or all (every admitted block)")
	fs.Float64Var(&c.NVMeWriteShare, "nvme-write-share", 0.5, "with --nvme-writes gated: the share of the drive's write rate the writes may use")
	fs.Float64Var(&c.NVMeDWPD, "nvme-dwpd", 0, "with --nvme-writes gated: drive writes per day of --nvme the writes may use (0: no endurance limit)")
	fs.BoolVar(&c.NVMePersist, "nvme-persist", false, "with --nvme-writes gated: also write blocks a load would not be worth (a tier kept across restarts)")
	fs.IntVar(&c.PrefetchBlocks, "prefetch-blocks", def.PrefetchBlocks, "a request that waits for the GPU has up to this many of its NVMe blocks copied into the host tier meanwhile, as the server's -prefetch-blocks (0: none)")
	fs.Var(&c.DecodeTokenTime, "decode-token-time", "time per output token while decoding, e.g. 30ms")
	fs.Var(&c.HandlingTime, "handling-time", "each request's time outside the GPU and its copies (HTTP, parsing, the cache's bookkeeping), added to its TTFT beside the GPU, e.g. 1.9ms (benchmarks/serve/report -handling fits it from a served run)")
	fs.Var(&c.HandlingTokenTime, "handling-token-time", "the same per prompt token, e.g. 410ns")
	fs.IntVar(&c.PrefillSlots, "prefill-slots", def.PrefillSlots, "requests prefilling at once, each with the GPU's full rate to itself (1: one GPU, prefills queue); 0: no limit")
	fs.BoolVar(&c.DecodeOnGPU, "decode-on-gpu", def.DecodeOnGPU, "decode shares the GPU with prefill, as the model server (examples/server) schedules it: between two prefills, one step (--decode-token-time) of every request decoding; needs --prefill-slots 1")
	fs.IntVar(&c.MaxBatch, "max-batch", def.MaxBatch, "with --decode-on-gpu: the most requests decoding at once; no prefill starts while that many decode (the server's -max-batch; 0: 16)")
	fs.IntVar(&c.MaxHoleBlocks, "max-hole-blocks", def.MaxHoleBlocks, "a lookup goes on past up to this many missing blocks, recomputed while the cached blocks after them load (0: it stops at the first)")
	fs.StringVar(&c.Mover, "mover", def.Mover, "what copies between the GPU and the host tier: device (kvtier.DeviceMover and the transfer engine, the code that serves, on the simulated device's virtual clock) or model (the replay's own channels)")
	fs.StringVar(&c.Strategy, "strategy", def.Strategy, "the strategy to lead with: cost, reload, recompute, gpu-only or none")
	fs.BoolVar(&c.Baselines, "baselines", def.Baselines, "also replay under the other strategies")
	fs.StringVar(&c.Calibration, "calibration", def.Calibration, "a calibration file (`kvtier calc --write-calibration`, a server's, or `kvtier probe --json`): measured prefill and links replace the presets")
	fs.Uint64Var(&f.seed, "seed", 0, "with --generate: the generator's seed (default: the workload's, 1; the bundled trace is chat with seed 1)")
	fs.Var(&c.MemoryBudget, "memory-budget", "memory the requests in flight may hold, e.g. 4GiB: their live heap, estimated, twice over for the collector's headroom; a strategy that passes it stops with an error naming it (not an OOM), the others are reported (0: no limit)")
	fs.BoolVar(&f.json, "json", false, "print the report as JSON (byte-identical for the same trace and flags)")
	fs.StringVar(&f.plotDir, "plot", "", "write TTFT (and --sweep-host) plots as SVG and PNG into this directory")
	fs.StringVar(&f.sweep, "sweep-host", "", "comma-separated host capacities to replay the chosen strategy at, e.g. 0,64GiB,256GiB,1TiB")
	fs.StringVar(&f.remoteSizes, "remote", "", "comma-separated remote tier (kvtier/remote) sizes to replay the chosen strategy with, e.g. 0,64GiB,512GiB (per GPU; needs --remote-link)")
	fs.StringVar(&f.remoteLink, "remote-link", "", "the remote tier's link: a results file that measured it (`kvtier probe --remote ADDRS --json FILE`, or benchmarks/remote's)")
	fs.StringVar(&f.progress, "progress", "auto", "progress bar on stderr: auto (on a terminal), always or never")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the replay (go tool pprof) to this file")
	fs.StringVar(&f.requestsOut, "requests-out", "", "write one JSON line per request and strategy to this file, as each request ends (replay.RequestRecord): strategy, index (trace order, from 0), arrival_s, start_s (its prefill), ttft_s, end_s, input_tokens, output_tokens, blocks, used_gpu_blocks, loaded_host_blocks, loaded_nvme_blocks, recomputed_blocks, missed_blocks, and planned_s under cost")
	return fs
}

// replayUsage prints the replay's usage and flags.
func replayUsage(fs *flag.FlagSet, stderr io.Writer) {
	fmt.Fprintf(stderr, `usage: kvtier replay [flags]

Replays a request trace (the bundled one by default) through kvtier's block
manager, policies and cost model on a virtual clock, under the chosen
strategy and the baselines (no prefix cache, GPU-only, always reload, always
recompute), and reports hit ratios, bytes moved and TTFT.

A --config file (JSON, the fields of --json's "config") is read first; flags
given on the command line override it.

flags:
`)
	fs.PrintDefaults()
}

// replayConfigFile reads the --config file at path; the flags given on
// fs's command line override its fields with their values in flags.
func replayConfigFile(path string, fs *flag.FlagSet, flags *replay.Config) (replay.Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return replay.Config{}, err
	}
	fileCfg, err := replay.LoadConfig(f)
	f.Close()
	if err != nil {
		return replay.Config{}, fmt.Errorf("%s: %w", path, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, o := range replayOverrides {
		if set[o.flag] {
			o.copy(&fileCfg, flags)
		}
	}
	return fileCfg, nil
}

// source is the trace to replay: generated (--generate), a file (--trace,
// read in format) or the bundled one.
func (f *replayFlags) source(format trace.Format) (replay.Source, error) {
	switch {
	case f.generate != "":
		if f.tracePath != "" {
			return replay.Source{}, errors.New("--generate and --trace: give one")
		}
		return f.generated()
	case f.tracePath == "":
		if f.requests != 0 || f.rate != 0 || f.seed != 0 {
			return replay.Source{}, errors.New("--requests, --sessions-per-second and --seed need --generate")
		}
		return replay.BundledSource(), nil
	default:
		src := replay.FileSource(f.tracePath)
		src.Format = format
		return src, nil
	}
}

// generated is --generate's trace: the workload's generator with
// --requests, --seed and --sessions-per-second over its defaults.
func (f *replayFlags) generated() (replay.Source, error) {
	var gen trace.GenConfig
	switch f.generate {
	case "chat":
		gen = trace.DefaultGenConfig()
	case "agentic":
		gen = trace.AgenticGenConfig()
	default:
		return replay.Source{}, fmt.Errorf("--generate %q: want chat or agentic", f.generate)
	}
	if f.requests < 0 {
		return replay.Source{}, fmt.Errorf("--requests %d: negative", f.requests)
	} else if f.requests > 0 {
		gen.Requests = f.requests
	}
	if f.seed != 0 {
		gen.Seed = f.seed
	}
	if f.rate < 0 {
		return replay.Source{}, fmt.Errorf("--sessions-per-second %g: negative", f.rate)
	} else if f.rate > 0 {
		gen.SessionsPerSecond = f.rate
	}
	if err := gen.Validate(); err != nil {
		return replay.Source{}, fmt.Errorf("--generate: %w", err)
	}
	name := fmt.Sprintf("generated:%s-%d", f.generate, gen.Requests)
	if f.seed != 0 {
		name += fmt.Sprintf("-seed%d", gen.Seed)
	}
	return replay.GeneratedSource(name, gen), nil
}

// sweeps parses --sweep-host, --remote and --remote-link into a.
func (f *replayFlags) sweeps(a *replayArgs) error {
	var err error
	if a.sweepHost, err = parseSizes("--sweep-host", f.sweep); err != nil {
		return err
	}
	if a.sweepRemote, err = parseSizes("--remote", f.remoteSizes); err != nil {
		return err
	}
	switch {
	case f.remoteSizes != "" && f.remoteLink == "":
		return errors.New("--remote needs --remote-link: the remote tier's measured link")
	case f.remoteSizes == "" && f.remoteLink != "":
		return errors.New("--remote-link without --remote: give the remote tier sizes to replay")
	case f.remoteLink != "":
		if a.remoteLink, err = replay.RemoteLinkFromResults(f.remoteLink); err != nil {
			return fmt.Errorf("--remote-link: %w", err)
		}
	}
	return nil
}

// parseSizes parses a comma-separated list of sizes ("" is none).
func parseSizes(flagName, list string) ([]replay.Bytes, error) {
	if list == "" {
		return nil, nil
	}
	var out []replay.Bytes
	for _, s := range strings.Split(list, ",") {
		b, err := replay.ParseBytes(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flagName, err)
		}
		out = append(out, b)
	}
	return out, nil
}

// checkPlotDir makes sure, before a replay that may take minutes, that the
// plots can be written into dir: it creates dir if absent, and creates and
// removes a file in it.
func checkPlotDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".kvtier-plot-check-*")
	if err != nil {
		return err
	}
	name := f.Name()
	return errors.Join(f.Close(), os.Remove(name))
}

// replayOverrides copies a flag's field from the flags' Config onto the
// file's.
var replayOverrides = []struct {
	flag string
	copy func(dst, src *replay.Config)
}{
	{"model", func(d, s *replay.Config) { d.Model = s.Model }},
	{"gpu", func(d, s *replay.Config) { d.GPU = s.GPU }},
	{"calibration", func(d, s *replay.Config) { d.Calibration = s.Calibration }},
	{"tp", func(d, s *replay.Config) { d.TP = s.TP }},
	{"block-tokens", func(d, s *replay.Config) { d.BlockTokens = s.BlockTokens }},
	{"gpu-kv", func(d, s *replay.Config) { d.GPUBytes = s.GPUBytes }},
	{"gpu-memory", func(d, s *replay.Config) { d.GPUMemoryBytes = s.GPUMemoryBytes }},
	{"max-output-tokens", func(d, s *replay.Config) { d.MaxOutputTokens = s.MaxOutputTokens }},
	{"host", func(d, s *replay.Config) { d.HostBytes = s.HostBytes }},
	{"nvme", func(d, s *replay.Config) { d.NVMeBytes = s.NVMeBytes }},
	{"host-link", func(d, s *replay.Config) { d.HostLink = s.HostLink }},
	{"nvme-link", func(d, s *replay.Config) { d.NVMeLink = s.NVMeLink }},
	{"policy", func(d, s *replay.Config) { d.Policy = s.Policy }},
	{"write-through", func(d, s *replay.Config) { d.WriteThrough = s.WriteThrough }},
	{"nvme-admission", func(d, s *replay.Config) { d.NVMeAdmission = s.NVMeAdmission }},
	{"host-codec", func(d, s *replay.Config) { d.HostCodec = s.HostCodec }},
	{"nvme-codec", func(d, s *replay.Config) { d.NVMeCodec = s.NVMeCodec }},
	{"remote-codec", func(d, s *replay.Config) { d.RemoteCodec = s.RemoteCodec }},
	{"codec-error-budget", func(d, s *replay.Config) { d.CodecErrorBudget = s.CodecErrorBudget }},
	{"nvme-writes", func(d, s *replay.Config) { d.NVMeWrites = s.NVMeWrites }},
	{"nvme-write-share", func(d, s *replay.Config) { d.NVMeWriteShare = s.NVMeWriteShare }},
	{"nvme-dwpd", func(d, s *replay.Config) { d.NVMeDWPD = s.NVMeDWPD }},
	{"nvme-persist", func(d, s *replay.Config) { d.NVMePersist = s.NVMePersist }},
	{"prefetch-blocks", func(d, s *replay.Config) { d.PrefetchBlocks = s.PrefetchBlocks }},
	{"decode-token-time", func(d, s *replay.Config) { d.DecodeTokenTime = s.DecodeTokenTime }},
	{"handling-time", func(d, s *replay.Config) { d.HandlingTime = s.HandlingTime }},
	{"handling-token-time", func(d, s *replay.Config) { d.HandlingTokenTime = s.HandlingTokenTime }},
	{"prefill-slots", func(d, s *replay.Config) { d.PrefillSlots = s.PrefillSlots }},
	{"decode-on-gpu", func(d, s *replay.Config) { d.DecodeOnGPU = s.DecodeOnGPU }},
	{"max-batch", func(d, s *replay.Config) { d.MaxBatch = s.MaxBatch }},
	{"max-hole-blocks", func(d, s *replay.Config) { d.MaxHoleBlocks = s.MaxHoleBlocks }},
	{"mover", func(d, s *replay.Config) { d.Mover = s.Mover }},
	{"strategy", func(d, s *replay.Config) { d.Strategy = s.Strategy }},
	{"baselines", func(d, s *replay.Config) { d.Baselines = s.Baselines }},
	{"memory-budget", func(d, s *replay.Config) { d.MemoryBudget = s.MemoryBudget }},
}

// requestsFile is --requests-out's file, buffered.
type requestsFile struct {
	f *os.File
	w *bufio.Writer
}

// createRequestsFile creates (or truncates) path before the replay, so that
// a path that cannot be written fails at once rather than after it.
func createRequestsFile(path string) (*requestsFile, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &requestsFile{f: f, w: bufio.NewWriterSize(f, 1<<16)}, nil
}

// close flushes the lines and closes the file.
func (r *requestsFile) close() error {
	return errors.Join(r.w.Flush(), r.f.Close())
}

// startCPUProfile starts a CPU profile into path; stop ends it and closes
// the file.
func startCPUProfile(path string) (stop func() error, err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}
