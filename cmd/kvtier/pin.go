package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"

	"github.com/schollz/progressbar/v3"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/bytesize"
	"kvtier.dev/kvtier/pinned"
)

func init() {
	register(command{name: "pin", summary: "pin a host pool with the pipelined allocator and report each stage's speed", run: runPin})
}

// pinConfig is what kvtier pin was asked to do.
type pinConfig struct {
	size      int64
	pages     pinned.PageMode
	fault     pinned.FaultMethod
	chunk     int64
	touchers  int
	registrar string // auto, cuda or mlock
	device    int
	progress  string // auto, always or never
}

// runPin allocates one pinned region the way a server's host tier starts,
// with a progress bar of the bytes faulted and registered, then prints the
// allocator's stages, which of them bound it, and frees the region.
func runPin(args []string, stdout, stderr io.Writer) int {
	cfg, err := pinParse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvtier pin: %v\n", err)
		return 2
	}
	reg, what, closeReg, err := pinRegistrar(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "kvtier pin: %v\n", err)
		return 1
	}
	defer closeReg()
	fmt.Fprintf(stdout, "pinning %s with %s\n", bytesize.Format(cfg.size), what)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	opts := pinned.Options{Registrar: reg, Pages: cfg.pages, Fault: cfg.fault, ChunkBytes: cfg.chunk, Touchers: cfg.touchers}
	if showProgress(cfg.progress, stderr) {
		bar := progressbar.NewOptions64(cfg.size, progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription("registered"), progressbar.OptionShowBytes(true),
			progressbar.OptionClearOnFinish())
		opts.Progress = func(_, registered int64) { bar.Set64(registered) }
		defer bar.Finish()
	}
	r, err := pinned.Alloc(ctx, cfg.size, opts)
	if err != nil {
		fmt.Fprintf(stderr, "kvtier pin: %v\n", err)
		return 1
	}
	st := r.Stats()
	if err := r.Close(); err != nil {
		fmt.Fprintf(stderr, "kvtier pin: free: %v\n", err)
		return 1
	}
	pinReport(stdout, st)
	return 0
}

func pinReport(w io.Writer, st pinned.Stats) {
	fmt.Fprintf(w, "end to end  %7.2f GiB/s in %v\n", st.TotalGiBPerSec(), st.TotalTime.Round(1e6))
	fmt.Fprintf(w, "touch       %7.2f GiB/s (%d touchers, %v)\n", st.TouchGiBPerSec(), st.Touchers, st.Fault)
	fmt.Fprintf(w, "register    %7.2f GiB/s (CPU %d, waited %v for touched chunks)\n", st.RegisterGiBPerSec(), st.RegisterCPU, st.RegisterWaitTime.Round(1e6))
	fmt.Fprintf(w, "bound by    %s\n", st.Bound())
	fmt.Fprintf(w, "pages       %v", st.PageMode)
	if st.PageNote != "" {
		fmt.Fprintf(w, " (%s)", st.PageNote)
	}
	fmt.Fprintf(w, "\nchunks      %d of %s\n", st.Chunks, bytesize.Format(st.ChunkBytes))
	fmt.Fprintf(w, "CPUs        %s\n", st.CPUNote)
	fmt.Fprintf(w, "VMA names   %v %s\n", st.VMANames, st.VMANote)
	fmt.Fprintf(w, "NUMA        %v %s\n", st.NUMABound, st.NUMANote)
}

// pinRegistrar opens what registers the memory: the GPU's driver, or mlock
// when asked or (with auto) when there is no driver.
func pinRegistrar(cfg pinConfig) (pinned.Registrar, string, func(), error) {
	if cfg.registrar != "mlock" {
		dev, err := cudastream.Open(cfg.device)
		if err == nil {
			return dev, fmt.Sprintf("cuMemHostRegister on %s", dev.Info().Name), func() { dev.Close() }, nil
		}
		if cfg.registrar == "cuda" || !errors.Is(err, cudastream.ErrNoDriver) {
			return nil, "", nil, fmt.Errorf("open device %d: %w", cfg.device, err)
		}
	}
	return pinned.MlockRegistrar{}, "mlock (no GPU registration)", func() {}, nil
}

func pinParse(args []string, stderr io.Writer) (pinConfig, error) {
	fs := flag.NewFlagSet("kvtier pin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: kvtier pin [flags]\n\nPins one host region with kvtier's pipelined allocator (parallel page\nfaulting, in-order registration on its own core), shows a progress bar on a\nterminal, and reports the speed of each stage and which one bound it.\n\nflags:\n")
		fs.PrintDefaults()
	}
	size := fs.String("size", "4GiB", "bytes to pin, e.g. 64GiB")
	pages := fs.String("pages", "thp", "page size: thp, 4k or hugetlb")
	fault := fs.String("fault", "touch", "how pages are faulted in: touch or populate-write")
	chunk := fs.String("chunk", "1GiB", "registration unit")
	touchers := fs.Int("touchers", 0, "faulting threads (0: derived from the machine)")
	registrar := fs.String("registrar", "auto", "auto (the GPU, else mlock), cuda or mlock")
	device := fs.Int("device", 0, "CUDA device ordinal")
	progress := fs.String("progress", "auto", "progress bar: auto (on a terminal), always or never")
	if err := fs.Parse(args); err != nil {
		return pinConfig{}, err
	}
	if fs.NArg() > 0 {
		return pinConfig{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg := pinConfig{touchers: *touchers, registrar: *registrar, device: *device, progress: *progress}
	var err error
	if cfg.size, err = bytesize.Parse(*size); err != nil {
		return cfg, fmt.Errorf("--size: %w", err)
	}
	if cfg.chunk, err = bytesize.Parse(*chunk); err != nil {
		return cfg, fmt.Errorf("--chunk: %w", err)
	}
	switch *pages {
	case "thp":
		cfg.pages = pinned.PagesTHP
	case "4k":
		cfg.pages = pinned.Pages4K
	case "hugetlb":
		cfg.pages = pinned.PagesHugeTLB
	default:
		return cfg, fmt.Errorf("--pages: %q is not thp, 4k or hugetlb", *pages)
	}
	switch *fault {
	case "touch":
		cfg.fault = pinned.FaultTouch
	case "populate-write":
		cfg.fault = pinned.FaultPopulateWrite
	default:
		return cfg, fmt.Errorf("--fault: %q is not touch or populate-write", *fault)
	}
	switch cfg.registrar {
	case "auto", "cuda", "mlock":
	default:
		return cfg, fmt.Errorf("--registrar: %q is not auto, cuda or mlock", cfg.registrar)
	}
	switch cfg.progress {
	case "auto", "always", "never":
	default:
		return cfg, fmt.Errorf("--progress: %q is not auto, always or never", cfg.progress)
	}
	if cfg.touchers < 0 {
		return cfg, fmt.Errorf("--touchers: %d is negative", cfg.touchers)
	}
	return cfg, nil
}
