package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

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
	if err := checkCgroupMemory(cfg.size, "/proc/self/cgroup", "/sys/fs/cgroup"); err != nil {
		fmt.Fprintf(stderr, "kvtier pin: %v\n", err)
		return 1
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
	if cfg.device < 0 {
		return cfg, fmt.Errorf("--device: %d is negative: name a CUDA device ordinal, 0 for the first", cfg.device)
	}
	return cfg, nil
}

// checkCgroupMemory refuses a size above the memory limit of a cgroup this
// process is in (cgroup v2 memory.max, or v1 memory.limit_in_bytes, of its
// cgroup or any ancestor): pinned pages count against it, and a process
// that crosses it is killed by the kernel with no message. selfCgroup is
// /proc/self/cgroup and root the cgroup mount, given so that tests can use
// a fake tree. Without a readable limit it checks nothing: the allocator
// still checks the machine's total memory.
func checkCgroupMemory(sizeBytes int64, selfCgroup, root string) error {
	limit, file, ok := cgroupMemoryLimit(selfCgroup, root)
	if ok && sizeBytes > limit {
		return fmt.Errorf("--size %s is more than this process's cgroup memory limit, %s (%s): the kernel would kill the process part way; ask for less, or raise the limit",
			bytesize.Format(sizeBytes), bytesize.Format(limit), file)
	}
	return nil
}

// cgroupMemoryLimit returns the lowest memory limit set on this process's
// cgroup or its ancestors, and the file that sets it; ok is false when no
// limit is set or none can be read.
func cgroupMemoryLimit(selfCgroup, root string) (limit int64, file string, ok bool) {
	b, err := os.ReadFile(selfCgroup)
	if err != nil {
		return 0, "", false
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var dir, name string
		switch {
		case parts[0] == "0" && parts[1] == "":
			dir, name = root, "memory.max" // v2
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			dir, name = filepath.Join(root, "memory"), "memory.limit_in_bytes" // v1
		default:
			continue
		}
		// Walk from the process's cgroup up to the mount's root.
		for p := filepath.Clean("/" + parts[2]); ; p = filepath.Dir(p) {
			f := filepath.Join(dir, p, name)
			if v, err := os.ReadFile(f); err == nil {
				n, err := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
				// "max" (v2) or a page-rounded MaxInt64 (v1) is no limit.
				if err == nil && n > 0 && n < 1<<62 && (!ok || n < limit) {
					limit, file, ok = n, f, true
				}
			}
			if p == "/" {
				break
			}
		}
	}
	return limit, file, ok
}
