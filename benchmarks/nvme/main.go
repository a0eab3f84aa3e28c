// Command nvme measures kvtier's NVMe tier against raw O_DIRECT I/O on the
// same slab file, in one run: sequential and random reads and writes of
// 256 KiB, 1 MiB and 4 MiB blocks. The tier's rows include everything a
// block costs (header, xxhash64 of the payload on write and its check on
// read, slot bookkeeping, the worker pool); the raw rows are bare pwrite and
// pread of the payload at the same offsets, from the same number of
// goroutines. Every figure is payload GiB/s.
//
// Each round runs every case once, raw first in even rounds and the tier
// first in odd ones; a warm-up pass writes every slot first. It writes
// nvme-<machine>.json and nvme-<machine>.md under --out.
//
//	go build -o .gpu/ ./benchmarks/nvme
//	.gpu/nvme --dir /tmp/kvtier-nvme-bench --machine h200 --out $OUT
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/nvme"
)

func main() {
	host, _ := os.Hostname()
	dir := flag.String("dir", "", "directory on the drive to measure (must support O_DIRECT); files are created in it and removed")
	machine := flag.String("machine", host, "machine name for the results files")
	sizeGiB := flag.Float64("size-gib", 0.5, "GiB of slots per block size (each pass reads or writes all of it)")
	rounds := flag.Int("rounds", 5, "timed rounds of every case")
	sizes := flag.String("sizes", "256KiB,1MiB,4MiB", "block sizes to measure, a subset of the default")
	out := flag.String("out", "benchmarks/results", "directory for nvme-<machine>.json and .md")
	depth := flag.Int("depth", 32, "I/Os in flight, the same for raw and tier: goroutines issuing blocks, and the tier's Config.Workers")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
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
	if *dir == "" || *rounds < 1 || *sizeGiB <= 0 || *depth < 1 {
		fmt.Fprintln(os.Stderr, "nvme: --dir is required; --rounds, --size-gib and --depth must be positive")
		os.Exit(2)
	}
	var bss []int
	for _, name := range strings.Split(*sizes, ",") {
		bs, ok := map[string]int{"256KiB": 256 << 10, "1MiB": 1 << 20, "4MiB": 4 << 20}[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "nvme: --sizes: unknown block size %q, want 256KiB, 1MiB or 4MiB\n", name)
			os.Exit(2)
		}
		bss = append(bss, bs)
	}
	if err := run(*dir, *machine, bss, *sizeGiB, *rounds, *out, *depth); err != nil {
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

func run(dir, machine string, sizes []int, sizeGiB float64, rounds int, out string, depth int) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	res := results.New("nvme", machine, commit())
	res.Notes = append(res.Notes,
		fmt.Sprintf("payload GiB/s, %d I/Os in flight, %.2f GiB per pass, %d rounds, raw and tier order alternating by round", depth, sizeGiB, rounds),
		fmt.Sprintf("%d CPUs; load average at start: %s", runtime.NumCPU(), loadavg()))
	start := time.Now()
	for _, bs := range sizes {
		note, err := measureSize(res, dir, bs, sizeGiB, rounds, depth)
		if err != nil {
			return fmt.Errorf("%s blocks: %w", sizeName(bs), err)
		}
		res.Notes = append(res.Notes, note)
	}
	res.Notes = append(res.Notes, "load average at end: "+loadavg(), "run took "+time.Since(start).Round(time.Second).String())
	if err := res.Write(out); err != nil {
		return err
	}
	return res.Markdown(os.Stdout)
}

// measureSize builds a store of sizeGiB of bs-byte slots and times every
// case, raw and through the tier, alternating their order by round.
func measureSize(res *results.File, dir string, bs int, sizeGiB float64, rounds, depth int) (string, error) {
	sub := filepath.Join(dir, fmt.Sprintf("bs-%d", bs))
	if err := os.MkdirAll(sub, 0o700); err != nil {
		return "", err
	}
	defer os.RemoveAll(sub)
	nslots := max(int(sizeGiB*(1<<30))/bs, depth)
	s, err := nvme.Open(nvme.Config{Dirs: []string{sub}, SlotsPerFile: nslots, BlockBytes: bs,
		MaxTokens: 16, Mode: nvme.ModeDirect, Workers: depth})
	if err != nil {
		return "", err
	}
	defer s.Close()
	info := s.Info()
	note := fmt.Sprintf("%s: %d slots of %d bytes, %s I/O, alignment %d bytes (%s), preallocated %v",
		sizeName(bs), nslots, info.SlotBytes, info.Mode, info.AlignBytes, info.AlignSource, info.Preallocated)
	raw, err := unix.Open(info.Files[0], unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open %s with O_DIRECT for the raw baseline: %w", info.Files[0], err)
	}
	defer unix.Close(raw)

	slots := make([]nvme.Slot, nslots)
	for i := range slots {
		if slots[i], err = s.Allocate(); err != nil {
			return "", err
		}
	}
	slices.Sort(slots)
	// The payload offset of slot i: after the superblock, i whole slots and
	// the slot's header region.
	payloadOff := func(slot nvme.Slot) int64 {
		return info.FirstSlotOffset + int64(slot)*info.SlotBytes + int64(info.HeaderBytes)
	}
	bufs := make([][]byte, depth)
	for i := range bufs {
		b, err := unix.Mmap(-1, 0, bs, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			return "", err
		}
		defer unix.Munmap(b)
		// Every buffer holds the same bytes, so that a raw write leaves the
		// tier's block (and its checksum) valid for the reads that follow.
		for j := range b {
			b[j] = byte(j*131 + j>>12)
		}
		bufs[i] = b
	}
	rng := rand.New(rand.NewPCG(1, uint64(bs)))
	perm := rng.Perm(nslots)
	seq := make([]int, nslots)
	for i := range seq {
		seq[i] = i
	}
	// one pass over all slots, in order, with depth goroutines; returns GiB/s.
	pass := func(write, random, tier bool) (float64, error) {
		order := seq
		if random {
			order = perm
		}
		var next atomic.Int64
		var firstErr error
		var once sync.Once
		var wg sync.WaitGroup
		t0 := time.Now()
		for g := range depth {
			buf := bufs[g]
			wg.Go(func() {
				ctx := context.Background()
				for {
					i := int(next.Add(1) - 1)
					if i >= len(order) {
						return
					}
					slot := slots[order[i]]
					var err error
					switch {
					case tier && write:
						err = s.Write(ctx, slot, nvme.BlockMeta{Key: uint64(slot) + 1, Parent: uint64(slot), Salt: 1}, buf)
					case tier:
						_, err = s.Read(ctx, slot, buf)
					case write:
						err = full(unix.Pwrite, raw, buf, payloadOff(slot))
					default:
						err = full(unix.Pread, raw, buf, payloadOff(slot))
					}
					if err != nil {
						once.Do(func() { firstErr = err })
						return
					}
				}
			})
		}
		wg.Wait()
		el := time.Since(t0).Seconds()
		return float64(len(order)) * float64(bs) / (1 << 30) / el, firstErr
	}
	// Warm up, untimed: write every slot through the tier, so that the
	// file is allocated on the drive and the reads find blocks.
	if _, err := pass(true, false, true); err != nil {
		return "", err
	}
	type key struct {
		c    int
		tier bool
	}
	samples := map[key][]float64{}
	for r := range rounds {
		for c, cs := range cases {
			order := []bool{false, true}
			if r%2 == 1 {
				order = []bool{true, false}
			}
			for _, tier := range order {
				v, err := pass(cs.write, cs.random, tier)
				if err != nil {
					return "", fmt.Errorf("%s (tier %v): %w", cs.name, tier, err)
				}
				samples[key{c, tier}] = append(samples[key{c, tier}], v)
			}
		}
	}
	if st := s.Stats(); st.CorruptDrops != 0 {
		return "", fmt.Errorf("the tier dropped %d corrupt slots during the run", st.CorruptDrops)
	}
	for c, cs := range cases {
		base := fmt.Sprintf("raw O_DIRECT %s %s", cs.name, sizeName(bs))
		res.Add(base, "GiB/s", samples[key{c, false}], "")
		res.Add(fmt.Sprintf("kvtier/nvme %s %s", cs.name, sizeName(bs)), "GiB/s", samples[key{c, true}], base)
	}
	return note, nil
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

func sizeName(bs int) string {
	if bs >= 1<<20 {
		return fmt.Sprintf("%dMiB", bs>>20)
	}
	return fmt.Sprintf("%dKiB", bs>>10)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
