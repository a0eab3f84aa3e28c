package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/bytesize"
	"kvtier.dev/internal/results"
)

func init() {
	register(command{name: "probe", summary: "the device's facts and measured link figures", run: runProbe})
}

// probeSmallCopyBytes and probeSmallCopies shape the issue-cost test: many
// small cuMemcpyHtoDAsync calls, as a naive per-block transfer would make.
const (
	probeSmallCopyBytes = 16 << 10
	probeSmallCopies    = 4096
	probeEventRounds    = 10000
)

// probeConfig is what the flags say.
type probeConfig struct {
	device   int
	jsonPath string
	size     int64 // bytes per bandwidth copy
	runs     int
	machine  string
	commit   string
	command  string
	// remote, when set, measures the remote tier instead of the GPU.
	remote *probeRemoteConfig
	// methods measures the copy engine's switch points instead.
	methods bool
	// nvme, when set, measures a drive instead of the GPU.
	nvme *probeNVMeConfig
}

// probeResult is the JSON that --json writes. "measured" is what the cost
// model reads; "rows" follow design.md's benchmark format.
type probeResult struct {
	results.File                // benchmark, machine, date, commit, command, rows
	Device       probeDevice    `json:"device"`
	Measured     probeMeasured  `json:"measured"`
	Switches     *probeSwitches `json:"switches,omitempty"` // --methods
}

type probeDevice struct {
	Name          string `json:"name"`
	CC            string `json:"cc"`
	SMCount       int    `json:"sm_count"`
	TotalMemBytes int64  `json:"total_mem_bytes"`
	CopyEngines   int    `json:"copy_engines"`
	PCIBusID      string `json:"pci_bus_id"`
	NUMANode      int    `json:"numa_node"`
	PCIeGen       int    `json:"pcie_gen"`
	PCIeWidth     int    `json:"pcie_width"`
	DriverVersion int    `json:"driver_version"`
	BatchCopy     bool   `json:"batch_copy"`
	HostNUMAAlloc bool   `json:"host_numa_alloc"`
}

type probeMeasured struct {
	H2DPinnedBytesPerS    float64 `json:"h2d_pinned_bytes_per_s"`
	D2HPinnedBytesPerS    float64 `json:"d2h_pinned_bytes_per_s"`
	H2DPageableBytesPerS  float64 `json:"h2d_pageable_bytes_per_s"`
	D2HPageableBytesPerS  float64 `json:"d2h_pageable_bytes_per_s"`
	BidirPinnedBytesPerS  float64 `json:"bidir_pinned_bytes_per_s"`
	SmallCopyBytes        int64   `json:"small_copy_bytes"`
	SmallCopyIssueSeconds float64 `json:"small_copy_issue_seconds"`
	SmallCopyBytesPerS    float64 `json:"small_copy_bytes_per_s"`
	EventRoundtripSeconds float64 `json:"event_roundtrip_seconds"`
}

func runProbe(args []string, stdout, stderr io.Writer) int {
	cfg, err := probeParseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvtier probe: %v\n", err)
		return 2
	}
	if cfg.nvme != nil {
		f, err := probeNVMe(context.Background(), *cfg.nvme, cfg, stdout)
		return probeFinish(stdout, stderr, "--nvme", f, err, cfg.jsonPath, "kvtier replay --nvme-link and the server's -nvme-link read it")
	}
	if cfg.remote != nil {
		f, err := probeRemote(context.Background(), *cfg.remote, cfg, stdout)
		return probeFinish(stdout, stderr, "--remote", f, err, cfg.jsonPath, "kvtier replay --remote-link reads it")
	}
	d, err := cudastream.Open(cfg.device)
	if errors.Is(err, cudastream.ErrNoDriver) {
		fmt.Fprintf(stderr, "kvtier probe: no CUDA driver/GPU found: %v\n", err)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvtier probe: open device %d: %v\n", cfg.device, err)
		return 1
	}
	defer d.Close()

	res := probeResult{File: *results.New("probe", cfg.machine, cfg.commit), Device: probeDeviceFacts(d.Info())}
	res.Command = cfg.command
	probePrintFacts(stdout, res.Device)
	if cfg.methods {
		fmt.Fprintf(stdout, "\nmeasuring the copy engine's methods: %s per transfer, %d runs after a warm-up\n", bytesize.Format(cfg.size), cfg.runs)
		sw, err := probeMethods(d, cfg.size, cfg.runs, &res.File)
		if err != nil {
			fmt.Fprintf(stderr, "kvtier probe: %v\n", err)
			return 1
		}
		res.Switches = &sw
		probePrintRows(stdout, res.Rows)
		probePrintSwitches(stdout, sw)
	} else {
		fmt.Fprintf(stdout, "\nmeasuring: %s per bandwidth copy, %d runs after a warm-up\n", bytesize.Format(cfg.size), cfg.runs)
		if err := probeMeasure(d, cfg, &res); err != nil {
			fmt.Fprintf(stderr, "kvtier probe: %v\n", err)
			return 1
		}
		probePrintRows(stdout, res.Rows)
	}
	if cfg.jsonPath != "" {
		if err := probeWriteJSON(cfg.jsonPath, &res); err != nil {
			fmt.Fprintf(stderr, "kvtier probe: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "wrote %s\n", cfg.jsonPath)
	}
	return 0
}

func probeParseFlags(args []string, stderr io.Writer) (probeConfig, error) {
	fs := flag.NewFlagSet("kvtier probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg probeConfig
	var size string
	fs.IntVar(&cfg.device, "device", 0, "CUDA device ordinal")
	fs.StringVar(&cfg.jsonPath, "json", "", "also write the results as JSON to this `file`")
	fs.StringVar(&size, "size", "1GiB", "bytes per bandwidth copy (e.g. 1073741824, 256MiB, 1GiB)")
	fs.IntVar(&cfg.runs, "runs", 5, "measured runs per figure, after one warm-up")
	fs.BoolVar(&cfg.methods, "methods", false, "measure the copy engine's switch points instead (kvtier/transfer's MethodAuto): each method forced, one way and both ways, blocks of 16 KiB to 2 MiB, --size per transfer; prints the transfer.Config switches for this GPU")
	fs.StringVar(&cfg.machine, "machine", "", "machine name for the JSON (default: the host name)")
	fs.StringVar(&cfg.commit, "commit", "", "commit for the JSON (default: the build's VCS revision)")
	remoteAddrs := fs.String("remote", "", "measure the remote tier instead of the GPU: Redis Cluster nodes, comma separated (host:port)")
	remoteBlock := fs.String("remote-block", "2MiB", "with --remote: the block size")
	remoteBlocks := fs.Int("remote-blocks", 16, "with --remote: blocks per pass")
	remoteDepth := fs.Int("remote-depth", 8, "with --remote: fetches in flight")
	nvmeDir := fs.String("nvme", "", "measure the drive under this directory instead of the GPU, as the NVMe tier uses it (a scratch file, removed after)")
	nvmeBlock := fs.String("nvme-block", "2MiB", "with --nvme: the tier's block, one I/O")
	nvmeBytes := fs.String("nvme-bytes", "256MiB", "with --nvme: bytes written and read back per round")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case *remoteAddrs != "":
		rb, err := bytesize.Parse(*remoteBlock)
		if err != nil {
			return cfg, fmt.Errorf("--remote-block: %w", err)
		}
		if rb < 1 || rb > 1<<30 {
			return cfg, fmt.Errorf("--remote-block: %d bytes, want 1 B to 1 GiB", rb)
		}
		if *remoteBlocks < 1 || *remoteDepth < 1 {
			return cfg, fmt.Errorf("--remote-blocks %d and --remote-depth %d: want at least 1", *remoteBlocks, *remoteDepth)
		}
		if set["device"] || set["size"] || cfg.methods {
			return cfg, errors.New("--remote measures the remote tier, not a GPU: --device, --size and --methods do not apply")
		}
		cfg.remote = &probeRemoteConfig{addrs: strings.Split(*remoteAddrs, ","), blockBytes: rb, blocks: *remoteBlocks, depth: *remoteDepth}
	case set["remote-block"] || set["remote-blocks"] || set["remote-depth"]:
		return cfg, errors.New("--remote-block, --remote-blocks and --remote-depth need --remote")
	}
	if err := probeNVMeFlags(&cfg, set, *nvmeDir, *nvmeBlock, *nvmeBytes); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	n, err := bytesize.Parse(size)
	if err != nil {
		return cfg, fmt.Errorf("--size: %w", err)
	}
	if n < probeSmallCopyBytes {
		return cfg, fmt.Errorf("--size: %d bytes is below the %d-byte minimum", n, probeSmallCopyBytes)
	}
	cfg.size = n
	if cfg.runs < 1 {
		return cfg, fmt.Errorf("--runs: %d, want at least 1", cfg.runs)
	}
	if cfg.device < 0 {
		return cfg, fmt.Errorf("--device: %d, want an ordinal >= 0", cfg.device)
	}
	if cfg.machine == "" {
		h, err := os.Hostname()
		if err != nil {
			h = "unknown"
		}
		cfg.machine = h
	}
	if cfg.commit == "" {
		cfg.commit = results.BuildCommit()
	}
	cfg.command = "kvtier probe"
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\$") {
			a = strconv.Quote(a)
		}
		cfg.command += " " + a
	}
	return cfg, nil
}

// probeNVMeFlags parses --nvme and its sizes into cfg.nvme.
func probeNVMeFlags(cfg *probeConfig, set map[string]bool, dir, block, bytes string) error {
	if dir == "" {
		if set["nvme-block"] || set["nvme-bytes"] {
			return errors.New("--nvme-block and --nvme-bytes need --nvme")
		}
		return nil
	}
	if cfg.remote != nil || set["device"] || set["size"] || cfg.methods {
		return errors.New("--nvme measures a drive, not a GPU or the remote tier: --remote, --device, --size and --methods do not apply")
	}
	bb, err := bytesize.Parse(block)
	if err != nil {
		return fmt.Errorf("--nvme-block: %w", err)
	}
	if bb < 4096 || bb%4096 != 0 || bb > 1<<30 {
		return fmt.Errorf("--nvme-block: %d bytes, want a multiple of 4 KiB up to 1 GiB", bb)
	}
	nb, err := bytesize.Parse(bytes)
	if err != nil {
		return fmt.Errorf("--nvme-bytes: %w", err)
	}
	if nb < bb {
		return fmt.Errorf("--nvme-bytes: %d bytes holds no --nvme-block of %d", nb, bb)
	}
	cfg.nvme = &probeNVMeConfig{dir: dir, blockBytes: bb, bytes: nb}
	return nil
}

func probeDeviceFacts(in cudastream.Info) probeDevice {
	return probeDevice{
		Name:          in.Name,
		CC:            fmt.Sprintf("%d.%d", in.CCMajor, in.CCMinor),
		SMCount:       in.SMCount,
		TotalMemBytes: in.TotalMemBytes,
		CopyEngines:   in.CopyEngines,
		PCIBusID:      in.PCIBusID,
		NUMANode:      in.NUMANode,
		PCIeGen:       in.PCIeGen,
		PCIeWidth:     in.PCIeWidth,
		DriverVersion: in.DriverVersion,
		BatchCopy:     in.BatchCopy,
		HostNUMAAlloc: in.HostNUMAAlloc,
	}
}

func probePrintFacts(w io.Writer, d probeDevice) {
	fmt.Fprintf(w, "device          %s (compute capability %s, %d SMs)\n", d.Name, d.CC, d.SMCount)
	fmt.Fprintf(w, "memory          %.1f GiB\n", float64(d.TotalMemBytes)/(1<<30))
	fmt.Fprintf(w, "copy engines    %d\n", d.CopyEngines)
	fmt.Fprintf(w, "PCI bus id      %s\n", d.PCIBusID)
	fmt.Fprintf(w, "NUMA node       %d\n", d.NUMANode)
	if d.PCIeGen > 0 {
		fmt.Fprintf(w, "PCIe link       Gen%d x%d\n", d.PCIeGen, d.PCIeWidth)
	} else {
		fmt.Fprintf(w, "PCIe link       unknown (sysfs has no readable link speed)\n")
	}
	fmt.Fprintf(w, "driver          CUDA %d.%d (%d)\n", d.DriverVersion/1000, d.DriverVersion%1000/10, d.DriverVersion)
	fmt.Fprintf(w, "batched copies  %v (cuMemcpyBatchAsync)\n", d.BatchCopy)
	fmt.Fprintf(w, "host NUMA alloc %v (cuMemCreate with a HOST_NUMA location)\n", d.HostNUMAAlloc)
}

// probeFinish ends a probe of a tier's storage (flag names it): it prints
// the rows of f, or err, and writes f to jsonPath if set (readers: what
// reads the file). It returns the exit code.
func probeFinish(stdout, stderr io.Writer, flag string, f *results.File, err error, jsonPath, readers string) int {
	if err != nil {
		fmt.Fprintf(stderr, "kvtier probe: %s: %v\n", flag, err)
		return 1
	}
	probePrintRows(stdout, f.Rows)
	if jsonPath == "" {
		return 0
	}
	if err := probeWriteJSON(jsonPath, f); err != nil {
		fmt.Fprintf(stderr, "kvtier probe: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s (%s)\n", jsonPath, readers)
	return 0
}

func probePrintRows(w io.Writer, rows []results.Row) {
	fmt.Fprintf(w, "\n%-28s %10s %10s %10s  %-8s %s\n", "measurement", "median", "min", "max", "unit", "vs baseline")
	for _, r := range rows {
		vs := ""
		if r.Baseline != "" {
			vs = fmt.Sprintf("%.3fx %s", r.Ratio, r.Baseline)
		}
		fmt.Fprintf(w, "%-28s %10.3f %10.3f %10.3f  %-8s %s\n", r.Name, r.Median, r.Min, r.Max, r.Unit, vs)
	}
}

func probeWriteJSON(path string, res any) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return fmt.Errorf("encode JSON: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write --json file: %w", err)
	}
	return nil
}

// probeBuffers are the memory one probe run copies between.
type probeBuffers struct {
	pinned   [2][]byte // cuMemHostAlloc
	pageable []byte    // plain Go memory, never registered
	dev      [2]cudastream.DevicePtr
	streams  [2]cudastream.Stream
	event    cudastream.Event
	small    []cudastream.Copy // the small copies as one batch
}

func probeAllocate(d cudastream.Device, size int64) (*probeBuffers, func(), error) {
	b := &probeBuffers{}
	var undo []func()
	release := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	for i := range b.pinned {
		h, err := d.HostAlloc(size)
		if err != nil {
			release()
			return nil, nil, fmt.Errorf("pinned host buffer of %s: %w", bytesize.Format(size), err)
		}
		b.pinned[i] = h
		undo = append(undo, func() { d.HostFree(h) })
		p, err := d.Alloc(size)
		if err != nil {
			release()
			return nil, nil, fmt.Errorf("device buffer of %s: %w", bytesize.Format(size), err)
		}
		b.dev[i] = p
		undo = append(undo, func() { d.Free(p) })
		s, err := d.NewStream(0)
		if err != nil {
			release()
			return nil, nil, fmt.Errorf("stream: %w", err)
		}
		b.streams[i] = s
		undo = append(undo, func() { s.Destroy() })
	}
	e, err := d.NewEvent(cudastream.EventOptions{})
	if err != nil {
		release()
		return nil, nil, fmt.Errorf("event: %w", err)
	}
	b.event = e
	undo = append(undo, func() { e.Destroy() })
	b.pageable = make([]byte, size)
	n := int(min(int64(probeSmallCopies), size/probeSmallCopyBytes))
	b.small = make([]cudastream.Copy, n)
	for i := range b.small {
		off := int64(i) * probeSmallCopyBytes
		b.small[i] = cudastream.Copy{
			Dst:   uint64(b.dev[0]) + uint64(off),
			Src:   cudastream.HostAddr(b.pinned[0][off:]),
			Bytes: probeSmallCopyBytes,
		}
	}
	// Touch every page so that the first run does not pay for page faults.
	for _, buf := range [][]byte{b.pinned[0], b.pinned[1], b.pageable} {
		for i := 0; i < len(buf); i += 4096 {
			buf[i] = byte(i >> 12)
		}
	}
	return b, release, nil
}

// probeTimed runs issue, then waits for the streams, and returns the wall time.
func probeTimed(issue func() error, streams ...cudastream.Stream) (time.Duration, error) {
	start := time.Now()
	if err := issue(); err != nil {
		return 0, err
	}
	for _, s := range streams {
		if err := s.Synchronize(); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// probeSample is one run's figures.
type probeSample struct {
	h2dPinned, d2hPinned, h2dPageable, d2hPageable, bidir float64 // bytes/s
	smallIssue                                            float64 // seconds per call
	smallRate                                             float64 // bytes/s
	batchRate                                             float64 // bytes/s, the same copies batched
	eventRound                                            float64 // seconds
}

func probeOnce(b *probeBuffers, size int64) (probeSample, error) {
	var r probeSample
	s0, s1 := b.streams[0], b.streams[1]
	rate := func(bytes int64, d time.Duration) float64 { return float64(bytes) / d.Seconds() }
	steps := []struct {
		what  string
		out   *float64
		bytes int64
		issue func() error
		wait  []cudastream.Stream
	}{
		{"HtoD pinned", &r.h2dPinned, size, func() error { return s0.CopyHtoD(b.dev[0], b.pinned[0]) }, []cudastream.Stream{s0}},
		{"DtoH pinned", &r.d2hPinned, size, func() error { return s0.CopyDtoH(b.pinned[0], b.dev[0]) }, []cudastream.Stream{s0}},
		{"HtoD pageable", &r.h2dPageable, size, func() error { return s0.CopyHtoD(b.dev[0], b.pageable) }, []cudastream.Stream{s0}},
		{"DtoH pageable", &r.d2hPageable, size, func() error { return s0.CopyDtoH(b.pageable, b.dev[0]) }, []cudastream.Stream{s0}},
		{"bidirectional pinned", &r.bidir, 2 * size, func() error {
			if err := s0.CopyHtoD(b.dev[0], b.pinned[0]); err != nil {
				return err
			}
			return s1.CopyDtoH(b.pinned[1], b.dev[1])
		}, []cudastream.Stream{s0, s1}},
	}
	for _, st := range steps {
		d, err := probeTimed(st.issue, st.wait...)
		if err != nil {
			return r, fmt.Errorf("%s: %w", st.what, err)
		}
		*st.out = rate(st.bytes, d)
	}

	n := int(min(int64(probeSmallCopies), size/probeSmallCopyBytes))
	var issued time.Duration
	total, err := probeTimed(func() error {
		start := time.Now()
		for i := range n {
			off := int64(i) * probeSmallCopyBytes
			if err := s0.CopyHtoD(b.dev[0]+cudastream.DevicePtr(off), b.pinned[0][off:off+probeSmallCopyBytes]); err != nil {
				return err
			}
		}
		issued = time.Since(start)
		return nil
	}, s0)
	if err != nil {
		return r, fmt.Errorf("small copies: %w", err)
	}
	r.smallIssue = issued.Seconds() / float64(n)
	r.smallRate = rate(int64(n)*probeSmallCopyBytes, total)
	total, err = probeTimed(func() error { return s0.CopyBatch(cudastream.HostToDevice, b.small) }, s0)
	if err != nil {
		return r, fmt.Errorf("batched small copies: %w", err)
	}
	r.batchRate = rate(int64(n)*probeSmallCopyBytes, total)

	start := time.Now()
	for range probeEventRounds {
		if err := b.event.Record(s1); err != nil {
			return r, fmt.Errorf("event record: %w", err)
		}
		if _, err := b.event.Query(); err != nil {
			return r, fmt.Errorf("event query: %w", err)
		}
	}
	r.eventRound = time.Since(start).Seconds() / probeEventRounds
	if err := s1.Synchronize(); err != nil {
		return r, fmt.Errorf("event stream: %w", err)
	}
	return r, nil
}

// probeMeasure warms up, runs cfg.runs rounds, and fills res's measured
// block and rows with medians and spreads.
func probeMeasure(d cudastream.Device, cfg probeConfig, res *probeResult) error {
	b, release, err := probeAllocate(d, cfg.size)
	if err != nil {
		return err
	}
	defer release()
	if _, err := probeOnce(b, cfg.size); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	samples := make([]probeSample, 0, cfg.runs)
	for range cfg.runs {
		s, err := probeOnce(b, cfg.size)
		if err != nil {
			return err
		}
		samples = append(samples, s)
	}
	pick := func(f func(probeSample) float64, scale float64) []float64 {
		v := make([]float64, len(samples))
		for i, s := range samples {
			v[i] = f(s) * scale
		}
		return v
	}
	const gib = 1.0 / (1 << 30)
	sz := bytesize.Format(cfg.size)
	small := fmt.Sprintf("%s x%d", bytesize.Format(probeSmallCopyBytes), int(min(int64(probeSmallCopies), cfg.size/probeSmallCopyBytes)))

	h2d, d2h, smallRow := "HtoD pinned "+sz, "DtoH pinned "+sz, "HtoD "+small
	res.Add(h2d, "GiB/s", pick(func(s probeSample) float64 { return s.h2dPinned }, gib), "")
	res.Add(d2h, "GiB/s", pick(func(s probeSample) float64 { return s.d2hPinned }, gib), "")
	res.Add("HtoD pageable "+sz, "GiB/s", pick(func(s probeSample) float64 { return s.h2dPageable }, gib), h2d)
	res.Add("DtoH pageable "+sz, "GiB/s", pick(func(s probeSample) float64 { return s.d2hPageable }, gib), d2h)
	res.Add("bidirectional pinned "+sz, "GiB/s", pick(func(s probeSample) float64 { return s.bidir }, gib), "")
	res.Add(smallRow, "GiB/s", pick(func(s probeSample) float64 { return s.smallRate }, gib), h2d)
	res.Add("HtoD "+small+" batched", "GiB/s", pick(func(s probeSample) float64 { return s.batchRate }, gib), smallRow)
	res.Add("HtoD "+small+" issue", "us/call", pick(func(s probeSample) float64 { return s.smallIssue }, 1e6), "")
	res.Add("event record+query", "us", pick(func(s probeSample) float64 { return s.eventRound }, 1e6), "")
	med := func(f func(probeSample) float64) float64 { return results.Median(pick(f, 1)) }
	res.Measured = probeMeasured{
		H2DPinnedBytesPerS:    med(func(s probeSample) float64 { return s.h2dPinned }),
		D2HPinnedBytesPerS:    med(func(s probeSample) float64 { return s.d2hPinned }),
		H2DPageableBytesPerS:  med(func(s probeSample) float64 { return s.h2dPageable }),
		D2HPageableBytesPerS:  med(func(s probeSample) float64 { return s.d2hPageable }),
		BidirPinnedBytesPerS:  med(func(s probeSample) float64 { return s.bidir }),
		SmallCopyBytes:        probeSmallCopyBytes,
		SmallCopyIssueSeconds: med(func(s probeSample) float64 { return s.smallIssue }),
		SmallCopyBytesPerS:    med(func(s probeSample) float64 { return s.smallRate }),
		EventRoundtripSeconds: med(func(s probeSample) float64 { return s.eventRound }),
	}
	return nil
}
