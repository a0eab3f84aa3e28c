// Command alloc measures, in one run, how fast pinned host memory can be
// made: the driver's cuMemHostAlloc, the VMM path (cuMemCreate with a
// HOST_NUMA location, map and set access), a serial mmap+touch+register on
// one thread, and kvtier's pipelined allocator (package pinned) with 4 KiB
// pages and with THP. It warms the guest memory it will use first, rotates
// the order of the paths from round to round, and writes
// alloc-<machine>.json and alloc-<machine>.md to --out.
//
// On the GPU machine:
//
//	alloc --machine h200 --out results
//
// Without a GPU (the CUDA rows are skipped, mlock registers):
//
//	alloc --registrar mlock --sizes 1GiB --rounds 3 --machine dev
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/bytesize"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/pinned"
)

// The paths, by their --modes names.
const (
	modeHostAlloc = "hostalloc"
	modeVMM       = "vmm"
	modeSerial    = "serial"
	modePinned4K  = "pinned4k"
	modePinnedTHP = "pinnedthp"
)

// Opt-in paths: the pinned allocator faulting with MADV_POPULATE_WRITE
// instead of touching (touch won on the H200, design.md).
const (
	modePinned4KPopulate  = "pinned4k-populate"
	modePinnedTHPPopulate = "pinnedthp-populate"
)

var defaultModes = []string{modeHostAlloc, modeVMM, modeSerial, modePinned4K, modePinnedTHP}

var allModes = append(slices.Clone(defaultModes), modePinned4KPopulate, modePinnedTHPPopulate)

// slow paths take tens of seconds at 64 GiB; --slow-rounds bounds them at
// every size but the first.
func isSlow(mode string) bool {
	return mode == modeHostAlloc || mode == modeVMM || mode == modeSerial
}

type config struct {
	sizes        []int64
	rounds       int
	slowRounds   int
	serialRounds int
	commit       string
	copySize     int64
	out          string
	machine      string
	modes        []string
	device       int
	registrar    string
	touchers     int
	chunkBytes   int64
	fault        pinned.FaultMethod
	bindNUMA     bool
	warm         bool
	budget       time.Duration
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "alloc:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "alloc:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("alloc", flag.ContinueOnError)
	host, _ := os.Hostname()
	sizes := fs.String("sizes", "32GiB,64GiB", "comma-separated allocation sizes")
	rounds := fs.Int("rounds", 3, "rounds; each rotates the order of the paths")
	slowRounds := fs.Int("slow-rounds", 2, "rounds of the slow paths (hostalloc, vmm) at sizes after the first, to keep a run under ~8 minutes")
	serialRounds := fs.Int("serial-rounds", 1, "rounds of the serial path (about 45 s at 64 GiB) at sizes after the first")
	copySize := fs.String("copy-check", "4GiB", "size of the copy check (DtoH/HtoD into the pinned region vs cuMemHostAlloc memory); 0 skips it")
	commitFlag := fs.String("commit", "", "commit to record (default: the one stamped at build time)")
	out := fs.String("out", "benchmarks/results", "directory for alloc-<machine>.json and .md")
	machine := fs.String("machine", host, "machine name used in the file names")
	modes := fs.String("modes", strings.Join(defaultModes, ","), "paths to measure, among: "+strings.Join(allModes, ","))
	device := fs.Int("device", 0, "CUDA device ordinal")
	registrar := fs.String("registrar", "cuda", "cuda (register with the driver) or mlock (no GPU: skips hostalloc and vmm)")
	touchers := fs.Int("touchers", 0, "toucher goroutines for the pinned paths (0: derived from the machine)")
	chunk := fs.String("chunk", "1GiB", "registration chunk of the pinned and serial paths")
	fault := fs.String("fault", "touch", "how the pinned paths fault pages: touch or populate")
	numa := fs.Bool("numa", true, "bind the pinned paths' pages to the GPU's NUMA node")
	warm := fs.Bool("warm", true, "touch and free the largest size once before measuring")
	budget := fs.Duration("budget", 8*time.Minute+30*time.Second, "after this long, skip remaining slow-path runs (results are written after every run)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	cfg := config{rounds: *rounds, slowRounds: *slowRounds, out: *out, machine: *machine, device: *device,
		registrar: *registrar, touchers: *touchers, bindNUMA: *numa, warm: *warm, budget: *budget,
		serialRounds: *serialRounds, commit: *commitFlag}
	if cfg.commit == "" {
		cfg.commit = commit()
	}
	var err error
	if cfg.sizes, err = parseSizes(*sizes); err != nil {
		return cfg, err
	}
	if *copySize != "0" {
		if cfg.copySize, err = bytesize.Parse(*copySize); err != nil {
			return cfg, fmt.Errorf("--copy-check: %w", err)
		}
	}
	if cfg.chunkBytes, err = bytesize.Parse(*chunk); err != nil {
		return cfg, fmt.Errorf("--chunk: %w", err)
	}
	for _, m := range strings.Split(*modes, ",") {
		if !slices.Contains(allModes, m) {
			return cfg, fmt.Errorf("--modes: unknown path %q (want some of %s)", m, strings.Join(allModes, ","))
		}
		cfg.modes = append(cfg.modes, m)
	}
	switch *fault {
	case "touch":
		cfg.fault = pinned.FaultTouch
	case "populate":
		cfg.fault = pinned.FaultPopulateWrite
	default:
		return cfg, fmt.Errorf("--fault %q: want touch or populate", *fault)
	}
	switch {
	case cfg.registrar != "cuda" && cfg.registrar != "mlock":
		return cfg, fmt.Errorf("--registrar %q: want cuda or mlock", cfg.registrar)
	case cfg.rounds < 1 || cfg.slowRounds < 1 || cfg.serialRounds < 1:
		return cfg, fmt.Errorf("--rounds %d, --slow-rounds %d, --serial-rounds %d: want at least 1", cfg.rounds, cfg.slowRounds, cfg.serialRounds)
	case cfg.machine == "" || strings.ContainsAny(cfg.machine, "/ "):
		return cfg, fmt.Errorf("--machine %q: want a name without spaces or slashes", cfg.machine)
	}
	return cfg, nil
}

// bench holds what the measurements share.
type bench struct {
	cfg   config
	dev   cudastream.Device // nil with --registrar mlock
	reg   pinned.Registrar
	node  int
	start time.Time
	s     *series
	notes []string
	seen  map[string]bool
}

func run(ctx context.Context, cfg config) error {
	b := &bench{cfg: cfg, node: -1, start: time.Now(), s: newSeries(), seen: map[string]bool{}}
	if cfg.registrar == "cuda" {
		dev, err := cudastream.Open(cfg.device)
		if err != nil {
			return fmt.Errorf("opening CUDA device %d (use --registrar mlock without a GPU): %w", cfg.device, err)
		}
		defer dev.Close()
		info := dev.Info()
		b.dev, b.reg, b.node = dev, dev, info.NUMANode
		b.note(fmt.Sprintf("Device: %s (driver %d), NUMA node %d, PCIe gen %d x%d.", info.Name, info.DriverVersion, info.NUMANode, info.PCIeGen, info.PCIeWidth))
	} else {
		b.reg = pinned.MlockRegistrar{}
		b.note("Registrar: mlock (no GPU); the cuMemHostAlloc and VMM rows are skipped and the serial path is the baseline.")
	}
	if cfg.warm {
		if err := b.warmUp(ctx); err != nil {
			return err
		}
	}
	b.note(fmt.Sprintf("Rounds: %d; at sizes after the first, cuMemHostAlloc and VMM run %d rounds and the serial path %d, to keep one run under ~8 minutes. The order of the paths rotates each round.",
		cfg.rounds, cfg.slowRounds, cfg.serialRounds))

	for r := range cfg.rounds {
		k := r % len(cfg.modes)
		order := append(slices.Clone(cfg.modes[k:]), cfg.modes[:k]...)
		for si, size := range cfg.sizes {
			for _, mode := range order {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if cfg.registrar == "mlock" && (mode == modeHostAlloc || mode == modeVMM) {
					continue
				}
				if si > 0 && (isSlow(mode) && r >= cfg.slowRounds || mode == modeSerial && r >= cfg.serialRounds) {
					continue
				}
				if isSlow(mode) && time.Since(b.start) > cfg.budget {
					fmt.Fprintf(os.Stderr, "budget %v spent: skipping %s %s\n", cfg.budget, mode, bytesize.Format(size))
					continue
				}
				if err := b.measure(ctx, r, size, mode); err != nil {
					return fmt.Errorf("round %d, %s, %s: %w", r+1, bytesize.Format(size), mode, err)
				}
				if err := b.save(); err != nil {
					return err
				}
			}
		}
	}
	if b.dev != nil && cfg.copySize > 0 {
		res, err := copyCheck(ctx, b.dev, cfg.copySize, 3, pinned.PagesTHP)
		if err != nil {
			return fmt.Errorf("copy check: %w", err)
		}
		n := bytesize.Format(cfg.copySize)
		add := func(name, base string, v []float64) {
			for _, x := range v {
				b.s.add(name+" "+n, base, "", x)
			}
		}
		add("DtoH into cuMemHostAlloc", "", res.dtohHostAlloc)
		add("DtoH into pinned THP", "DtoH into cuMemHostAlloc "+n, res.dtohPinned)
		add("HtoD from cuMemHostAlloc", "", res.htodHostAlloc)
		add("HtoD from pinned THP", "HtoD from cuMemHostAlloc "+n, res.htodPinned)
		b.note(fmt.Sprintf("Copy check (%s, THP region): data round-trips intact; DtoH median %.2f GiB/s into the region vs %.2f into cuMemHostAlloc memory; HtoD %.2f vs %.2f.",
			n, results.Median(res.dtohPinned), results.Median(res.dtohHostAlloc), results.Median(res.htodPinned), results.Median(res.htodHostAlloc)))
		if err := b.save(); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "done in %v; results in %s\n", time.Since(b.start).Round(time.Second), cfg.out)
	return nil
}

func (b *bench) note(s string) {
	b.notes = append(b.notes, s)
	fmt.Fprintln(os.Stderr, s)
}

// rowName names a path's row at a size; the baseline is the driver's
// cuMemHostAlloc at the same size (the serial path without a GPU).
func (b *bench) rowName(mode string, size int64) string {
	n := bytesize.Format(size)
	switch mode {
	case modeHostAlloc:
		return "cuMemHostAlloc " + n
	case modeVMM:
		return "VMM cuMemCreate(HOST_NUMA) " + n
	case modeSerial:
		return "serial mmap+touch+register " + n
	case modePinned4K:
		return "pinned 4KiB " + n
	case modePinnedTHP:
		return "pinned THP " + n
	case modePinned4KPopulate:
		return "pinned 4KiB populate-write " + n
	case modePinnedTHPPopulate:
		return "pinned THP populate-write " + n
	}
	return mode + " " + n
}

func (b *bench) baselineFor(mode string, size int64) string {
	base := modeHostAlloc
	if b.cfg.registrar == "mlock" {
		base = modeSerial
	}
	if mode == base {
		return ""
	}
	return b.rowName(base, size)
}

func (b *bench) vmmOf(name string) string {
	if b.cfg.registrar == "mlock" {
		return ""
	}
	for _, size := range b.cfg.sizes {
		if strings.HasSuffix(name, " "+bytesize.Format(size)) {
			return b.rowName(modeVMM, size)
		}
	}
	return ""
}

func (b *bench) measure(ctx context.Context, round int, size int64, mode string) error {
	name := b.rowName(mode, size)
	var gibps float64
	var detail string
	switch mode {
	case modeHostAlloc:
		t0 := time.Now()
		mem, err := b.dev.HostAlloc(size)
		el := time.Since(t0)
		if err != nil {
			return err
		}
		if err := b.dev.HostFree(mem); err != nil {
			return err
		}
		gibps = rate(size, el)
	case modeVMM:
		t0 := time.Now()
		h, err := b.dev.HostAllocVMM(size, b.node)
		el := time.Since(t0)
		if err != nil {
			return err
		}
		if err := h.Close(); err != nil {
			return err
		}
		gibps = rate(size, el)
	case modeSerial:
		el, touch, reg, err := serial(size, b.cfg.chunkBytes, b.reg)
		if err != nil {
			return err
		}
		gibps = rate(size, el)
		detail = fmt.Sprintf("touch %.2f GiB/s, register %.2f GiB/s", rate(size, touch), rate(size, reg))
	case modePinned4K, modePinnedTHP, modePinned4KPopulate, modePinnedTHPPopulate:
		pages := pinned.Pages4K
		if mode == modePinnedTHP || mode == modePinnedTHPPopulate {
			pages = pinned.PagesTHP
		}
		fault := b.cfg.fault
		if mode == modePinned4KPopulate || mode == modePinnedTHPPopulate {
			fault = pinned.FaultPopulateWrite
		}
		opts := pinned.Options{Registrar: b.reg, Pages: pages, Fault: fault, ChunkBytes: b.cfg.chunkBytes, Touchers: b.cfg.touchers}
		if b.cfg.bindNUMA {
			opts.NUMANodes = []int{b.node}
		}
		t0 := time.Now()
		r, err := pinned.Alloc(ctx, size, opts)
		el := time.Since(t0)
		if err != nil {
			return err
		}
		st := r.Stats()
		huge, herr := r.HugePageBytes()
		if err := r.Close(); err != nil {
			return err
		}
		gibps = rate(size, el)
		b.s.add(name+" touch", "", "touch stage", st.TouchGiBPerSec())
		b.s.add(name+" register", "", "register stage", st.RegisterGiBPerSec())
		detail = fmt.Sprintf("touch %.2f GiB/s, register %.2f GiB/s (waited %v), bound: %s; huge pages %d MiB (%v)",
			st.TouchGiBPerSec(), st.RegisterGiBPerSec(), st.RegisterWaitTime.Round(time.Millisecond), st.Bound(), huge>>20, herr)
		if !b.seen[mode] {
			b.seen[mode] = true
			pages := st.PageMode.String()
			if st.PageNote != "" {
				pages += " (" + st.PageNote + ")"
			}
			b.note(fmt.Sprintf("%s: pages %s; fault %v; %d touchers on CPUs %v; %s; VMA names %v (%s); NUMA: %s.",
				name, pages, st.Fault, st.Touchers, st.TouchCPUs, st.CPUNote, st.VMANames, st.VMANote, st.NUMANote))
		}
	}
	b.s.add(name, b.baselineFor(mode, size), "", gibps)
	fmt.Fprintf(os.Stderr, "[%v] round %d %-40s %7.2f GiB/s  %s\n", time.Since(b.start).Round(time.Second), round+1, name, gibps, detail)
	return nil
}

func rate(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / float64(1<<30) / d.Seconds()
}

// warmUp touches and frees the largest size once, so that no path pays for
// the VM's first touch of guest memory (several times slower, design.md).
func (b *bench) warmUp(ctx context.Context) error {
	size := slices.Max(b.cfg.sizes)
	t0 := time.Now()
	r, err := pinned.Alloc(ctx, size, pinned.Options{Registrar: nopRegistrar{}, Pages: pinned.Pages4K, ChunkBytes: b.cfg.chunkBytes})
	if err != nil {
		return fmt.Errorf("warming %s: %w", bytesize.Format(size), err)
	}
	st := r.Stats()
	if err := r.Close(); err != nil {
		return err
	}
	b.note(fmt.Sprintf("Warm-up: touched and freed %s in %v (%.2f GiB/s, %d touchers).",
		bytesize.Format(size), time.Since(t0).Round(time.Millisecond), st.TouchGiBPerSec(), st.Touchers))
	return nil
}

// nopRegistrar registers nothing: the warm-up only needs the pages touched.
type nopRegistrar struct{}

func (nopRegistrar) HostRegister([]byte) error   { return nil }
func (nopRegistrar) HostUnregister([]byte) error { return nil }

func (b *bench) save() error {
	rep := report{Benchmark: "alloc", Machine: b.cfg.machine, Date: time.Now().UTC().Format("2006-01-02"),
		Commit: b.cfg.commit, Command: strings.Join(os.Args, " "), Rows: b.s.rows()}
	pre := append(slices.Clone(b.notes), "", "Each row is allocation throughput (bytes over wall-clock until the memory is pinned and registered; freeing is not timed). "+
		"The touch and register rows are the pinned allocator's per-stage rates: bytes over the time of that stage alone, so the slower of the two bounds the pipeline.")
	return write(b.cfg.out, rep, pre, b.vmmOf)
}

// buildCommit can be set at build time:
// go build -ldflags "-X main.buildCommit=$(git rev-parse HEAD)".
var buildCommit string

// commit is buildCommit when set, else the revision the build recorded.
func commit() string {
	if buildCommit != "" {
		return buildCommit
	}
	return results.BuildCommit()
}
