// Command nvme measures kvtier's NVMe tier against raw O_DIRECT I/O on the
// same slab file, in one run: sequential and random reads and writes of
// 256 KiB, 1 MiB and 4 MiB blocks. The tier's rows include everything a
// block costs (header, XXH3-64 of the payload on write and its check on
// read, slot bookkeeping, the worker pool); the raw rows are bare pwrite and
// pread of the payload at the same offsets, from the same number of
// goroutines. Throughput rows are payload GiB/s (ratio: tier over raw);
// CPU rows are the CPU time (user+system, this process, getrusage) one
// block cost, in µs, raw and tier side by side (ratio: raw over tier, so
// 0.67 is "tier costs 1.5x raw"), one sample per round.
//
// Every case also times "raw O_DIRECT+touch": the raw I/O plus one SIMD
// pass over the payload's bytes (bytes.Count), the least that verifying
// every byte can cost on the machine, since the payload is cold in memory
// after DMA. The tier's CPU per block cannot go below it while it checks
// every block; tier against raw+touch is what its code costs beyond that.
//
// Read cases also time a diagnostic raw row, "raw O_DIRECT+header": one
// preadv of the header region and the payload, the very bytes the tier
// reads, so that a gap between the tier and raw splits into what the on-disk
// layout costs (raw+header vs raw) and what the tier's code costs (tier vs
// raw+header). The notes give, per case, the CPU time a block cost this
// process (getrusage), the device requests it took and their mean size
// (/proc/diskstats), and the device's queue limits.
//
// With --gpu (a CUDA device, and a binary built with cgo) two more rows
// per case time the tier as the DeviceMover drives it when its engine sums
// on the GPU (transfer.Config.Sums): "kvtier/nvme, GPU sums" writes each
// block with the word sum the GPU computed before copying it out
// (nvme.WriteOp.WordSummed) and reads each with its check left to the GPU
// (nvme.ReadOp.DeferWordSum), which copies the block in, sums it there and
// compares; and "raw O_DIRECT+copy" is the raw I/O plus the same copy to or
// from the GPU, with no checksum at all. Both move --gpu-batch blocks per
// wait for the GPU, as a transfer of that many blocks does (the engine waits
// once per transfer), each block still its own I/O at the same depth. The
// tier's blocks live in a second store of the same geometry on the same
// drive, so that the other tier rows keep measuring XXH3 blocks. The CPU
// rows count the CUDA calls too.
//
// Each round runs every case once, the order of the modes rotating by
// round; a warm-up pass writes every slot first. It writes
// nvme-<machine>.json and nvme-<machine>.md under --out.
//
//	CGO_ENABLED=0 go build -o .gpu/nv/ ./benchmarks/nvme
//	.gpu/nv/nvme --dir /tmp/kvtier-nvme-bench --machine h200 --out $OUT
//	.gpu/nv/nvme --dir /tmp/kvtier-nvme-bench --machine h200-thp --thp --out $OUT
//	go build -o .gpu/nvg/ ./benchmarks/nvme # with cgo, for --gpu
//	.gpu/nvg/nvme --dir /tmp/kvtier-nvme-bench --machine h200 --gpu --out $OUT
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"kvtier.dev/internal/bytesize"
	"kvtier.dev/internal/results"
)

// options are the command's flags, checked.
type options struct {
	dir, machine, out, cpuprofile string
	sizes                         []int
	sizeGiB                       float64
	rounds, depth, workers        int
	thp, gpu                      bool
	gpuBatch                      int
}

// parseArgs parses and checks the flags; a bad one is an error naming it.
func parseArgs(args []string) (options, error) {
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("nvme", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.dir, "dir", "", "directory on the drive to measure (must support O_DIRECT); files are created in it and removed")
	fs.StringVar(&o.machine, "machine", host, "machine name for the results files")
	fs.Float64Var(&o.sizeGiB, "size-gib", 0.5, "GiB of slots per block size (each pass reads or writes all of it)")
	fs.IntVar(&o.rounds, "rounds", 5, "timed rounds of every case")
	sizes := fs.String("sizes", "256KiB,1MiB,4MiB", "block sizes to measure")
	fs.StringVar(&o.out, "out", "benchmarks/results", "directory for nvme-<machine>.json and .md")
	fs.IntVar(&o.depth, "depth", 32, "I/Os in flight, the same for raw and tier: goroutines issuing blocks")
	fs.BoolVar(&o.thp, "thp", false, "put the I/O buffers on transparent huge pages (MADV_HUGEPAGE), like the pinned host pool; default 4 KiB pages")
	fs.IntVar(&o.workers, "workers", 0, "the tier's Config.Workers (0: the same as --depth); fewer than --depth shows whether the tier keeps its workers busy with I/O")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile to this file")
	fs.BoolVar(&o.gpu, "gpu", false, "also time raw O_DIRECT+copy and the tier with its payloads summed and checked on GPU 0 (needs a CUDA device)")
	fs.IntVar(&o.gpuBatch, "gpu-batch", 8, "--gpu: blocks per round trip to the GPU (per wait), as a transfer of that many blocks")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q: every setting is a flag", fs.Args())
	case o.dir == "":
		return o, errors.New("--dir is required: a directory on the drive to measure")
	case o.rounds < 1:
		return o, fmt.Errorf("--rounds %d: must be at least 1", o.rounds)
	case !(o.sizeGiB > 0):
		return o, fmt.Errorf("--size-gib %v: must be positive", o.sizeGiB)
	case o.depth < 1:
		return o, fmt.Errorf("--depth %d: must be at least 1", o.depth)
	case o.workers < 0:
		return o, fmt.Errorf("--workers %d: must be at least 0 (0: the same as --depth)", o.workers)
	case o.gpuBatch < 1 || o.gpuBatch > 256:
		return o, fmt.Errorf("--gpu-batch %d: must be in [1, 256] (the sum kernel's blocks per launch)", o.gpuBatch)
	}
	if o.workers == 0 {
		o.workers = o.depth
	}
	for _, name := range strings.Split(*sizes, ",") {
		bs, err := bytesize.Parse(name)
		if err != nil || bs > 1<<30 || bs%4096 != 0 {
			return o, fmt.Errorf("--sizes: %q is not a block size: a multiple of 4KiB up to 1GiB, e.g. 256KiB,1MiB,4MiB", name)
		}
		o.sizes = append(o.sizes, int(bs))
	}
	return o, nil
}

func main() {
	o, err := parseArgs(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nvme:", err)
		os.Exit(2)
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "nvme:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "nvme:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(o); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "nvme:", err)
		os.Exit(1)
	}
}

// the cases measured for each block size, in this order in the results.
var cases = []struct {
	name          string
	write, random bool
}{
	{"seq write", true, false}, {"seq read", false, false},
	{"rand write", true, true}, {"rand read", false, true},
}

// how a pass moves a block.
type mode int

const (
	modeRaw      mode = iota // pread/pwrite of the payload
	modeRawHdr               // preadv of the header region and the payload (reads only)
	modeRawTouch             // pread/pwrite of the payload and one pass over its bytes
	modeTier                 // Store.Read / Store.Write
	modeRawCopy              // --gpu: raw, and the payload's copy to (reads) or from (writes) the GPU
	modeTierGPU              // --gpu: the tier with word sums: summed on the GPU before a write, checked there after a read
	numModes
)

func run(o options) error {
	dir, machine, sizes, sizeGiB, rounds, out := o.dir, o.machine, o.sizes, o.sizeGiB, o.rounds, o.out
	depth, workers, thp := o.depth, o.workers, o.thp
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	res := results.New("nvme", machine, "")
	res.Notes = append(res.Notes,
		fmt.Sprintf("payload GiB/s, %d I/Os in flight (tier: %d workers), buffers on %s pages, %.2f GiB per pass, %d rounds, order of the modes rotating by round", depth, workers, map[bool]string{false: "4 KiB", true: "transparent huge"}[thp], sizeGiB, rounds),
		fmt.Sprintf("%d CPUs; load average at start: %s", runtime.NumCPU(), loadavg()))
	start := time.Now()
	for _, bs := range sizes {
		note, err := measureSize(res, o, bs)
		if err != nil {
			return fmt.Errorf("%s blocks: %w", bytesize.Format(int64(bs)), err)
		}
		res.Notes = append(res.Notes, note)
	}
	res.Notes = append(res.Notes, "load average at end: "+loadavg(), "run took "+time.Since(start).Round(time.Second).String())
	if err := res.Write(out); err != nil {
		return err
	}
	return res.Markdown(os.Stdout)
}

// measureSize builds a store of --size-gib of bs-byte slots, times every
// case, raw and through the tier, alternating their order by round, adds
// the rows to res and returns the size's note.
func measureSize(res *results.File, o options, bs int) (string, error) {
	b, err := newBench(o, bs)
	if err != nil {
		return "", err
	}
	defer b.close()
	if b.dev.ok() {
		res.Notes = append(res.Notes, fmt.Sprintf("%s blocks on device %s: %s", bytesize.Format(int64(bs)), b.dev.name, b.dev.queue()))
	}
	if err := b.warmUp(); err != nil {
		return "", err
	}
	t, err := b.timeRounds()
	if err != nil {
		return "", err
	}
	if err := b.checkStores(); err != nil {
		return "", err
	}
	note := b.sizeNote()
	for c := range cases {
		tierCPU, gpuCPU := b.addCaseRows(res, c, t)
		note += b.caseNote(c, t, tierCPU, gpuCPU)
	}
	return note, nil
}

var modeNames = [numModes]string{"raw", "raw+header", "raw+touch", "tier", "raw+copy", "tier, GPU sums"}

// touchByte and touched make the raw+touch pass: bytes.Count reads every
// byte of the payload at the speed memory delivers it (SIMD, no early
// exit), the least that any check of every byte costs; touched keeps the
// result live.
var (
	touchByte = []byte{0xa5}
	touched   atomic.Int64
)

// fullv reads hdr then b from off with preadv, continuing after short reads.
func fullv(fd int, hdr, b []byte, off int64) error {
	for len(hdr)+len(b) > 0 {
		n, err := unix.Preadv(fd, [][]byte{hdr, b}, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("short I/O")
		}
		off += int64(n)
		k := min(n, len(hdr))
		hdr, n = hdr[k:], n-k
		b = b[n:]
	}
	return nil
}

// full moves all of b at off with pread or pwrite.
func full(call func(int, []byte, int64) (int, error), fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := call(fd, b, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("short I/O")
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// cpuTime is the user and system CPU time this process has used.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
