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
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"kvtier.dev/internal/bytesize"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/nvme"
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

// measureSize builds a store of sizeGiB of bs-byte slots and times every
// case, raw and through the tier, alternating their order by round.
func measureSize(res *results.File, o options, bs int) (string, error) {
	dir, sizeGiB, rounds, depth, workers, thp := o.dir, o.sizeGiB, o.rounds, o.depth, o.workers, o.thp
	sub := filepath.Join(dir, fmt.Sprintf("bs-%d", bs))
	if err := os.MkdirAll(sub, 0o700); err != nil {
		return "", err
	}
	defer os.RemoveAll(sub)
	nslots := max(int(sizeGiB*(1<<30))/bs, depth)
	s, err := nvme.Open(nvme.Config{Dirs: []string{sub}, SlotsPerFile: nslots, BlockBytes: bs,
		MaxTokens: 16, Mode: nvme.ModeDirect, Workers: workers})
	if err != nil {
		return "", err
	}
	defer s.Close()
	info := s.Info()
	note := fmt.Sprintf("%s: %d slots of %d bytes, %s I/O, alignment %d bytes (%s), preallocated %v",
		bytesize.Format(int64(bs)), nslots, info.SlotBytes, info.Mode, info.AlignBytes, info.AlignSource, info.Preallocated)
	dev := newDiskStats(info.Files[0])
	if dev.ok() {
		res.Notes = append(res.Notes, fmt.Sprintf("%s blocks on device %s: %s", bytesize.Format(int64(bs)), dev.name, dev.queue()))
	}
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
	// One mapping holds every goroutine's buffer; with --thp it is 2 MiB
	// aligned and asks for transparent huge pages, as the pinned host pool
	// that feeds the tier in a server does.
	const hugeBytes = 2 << 20
	mem, err := unix.Mmap(-1, 0, depth*bs+hugeBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return "", err
	}
	defer unix.Munmap(mem)
	base := mem
	if thp {
		p := uintptr(unsafe.Pointer(&mem[0]))
		base = mem[(hugeBytes-int(p%hugeBytes))%hugeBytes:]
		if err := unix.Madvise(base[:depth*bs], unix.MADV_HUGEPAGE); err != nil {
			return "", fmt.Errorf("--thp: madvise(MADV_HUGEPAGE): %w", err)
		}
	}
	bufs := make([][]byte, depth)
	for i := range bufs {
		b := base[i*bs : (i+1)*bs : (i+1)*bs]
		// Every buffer holds the same bytes, so that a raw write leaves the
		// tier's block (and its checksum) valid for the reads that follow.
		for j := range b {
			b[j] = byte(j*131 + j>>12)
		}
		bufs[i] = b
	}
	// --gpu: a device block per goroutine, and a second store of its own
	// (same geometry, same drive) for the word-summed blocks, so that the
	// tier's CPU rows keep measuring XXH3 blocks.
	var gpu *gpuSide
	var s2 *nvme.Store
	var slots2 []nvme.Slot
	if o.gpu {
		fill := func(b []byte) {
			for j := range b {
				b[j] = byte(j%bs*131 + j%bs>>12)
			}
		}
		if gpu, err = newGPUSide(depth, o.gpuBatch, bs, fill); err != nil {
			return "", err
		}
		defer gpu.close()
		sub2 := sub + "-gpu"
		if err := os.MkdirAll(sub2, 0o700); err != nil {
			return "", err
		}
		defer os.RemoveAll(sub2)
		if s2, err = nvme.Open(nvme.Config{Dirs: []string{sub2}, SlotsPerFile: nslots, BlockBytes: bs,
			MaxTokens: 16, Mode: nvme.ModeDirect, Workers: workers}); err != nil {
			return "", err
		}
		defer s2.Close()
		slots2 = make([]nvme.Slot, nslots)
		for i := range slots2 {
			if slots2[i], err = s2.Allocate(); err != nil {
				return "", err
			}
		}
		slices.Sort(slots2)
	}
	// Header regions for the raw+header reads.
	hdrs := make([][]byte, depth)
	for i := range hdrs {
		b, err := unix.Mmap(-1, 0, info.HeaderBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			return "", err
		}
		defer unix.Munmap(b)
		hdrs[i] = b
	}
	rng := rand.New(rand.NewPCG(1, uint64(bs)))
	perm := rng.Perm(nslots)
	seq := make([]int, nslots)
	for i := range seq {
		seq[i] = i
	}
	// gpuPass is one goroutine's share of a pass in a GPU mode: batches of
	// --gpu-batch blocks, each batch one round trip to the GPU, each block
	// its own I/O as in the raw rows.
	gpuPass := func(w *gpuWorker, next *atomic.Int64, order []int, write bool, m mode) error {
		ctx := context.Background()
		var rd [1]nvme.ReadOp
		var wr [1]nvme.WriteOp
		k := int64(len(w.bufs))
		want := make([]uint64, 0, k)
		for {
			i0 := int(next.Add(k) - k)
			n := min(int(k), len(order)-i0)
			if n <= 0 {
				return nil
			}
			batch := order[i0 : i0+n]
			tier := m == modeTierGPU
			if write {
				sums, err := w.fromDevice(n, tier)
				if err != nil {
					return err
				}
				for j, o := range batch {
					if !tier {
						if err := full(unix.Pwrite, raw, w.bufs[j], payloadOff(slots[o])); err != nil {
							return err
						}
						continue
					}
					wr[0] = nvme.WriteOp{Slot: slots2[o], Meta: nvme.BlockMeta{Key: uint64(slots2[o]) + 1, Parent: uint64(slots2[o]), Salt: 1},
						Payload: w.bufs[j], WordSummed: true, WordSum: sums[j]}
					if err := s2.WriteBatch(ctx, wr[:]); err != nil {
						return err
					}
					if wr[0].Err != nil {
						return wr[0].Err
					}
				}
				continue
			}
			want = want[:0]
			for j, o := range batch {
				if !tier {
					if err := full(unix.Pread, raw, w.bufs[j], payloadOff(slots[o])); err != nil {
						return err
					}
					continue
				}
				rd[0] = nvme.ReadOp{Slot: slots2[o], Dst: w.bufs[j], DeferWordSum: true, Meta: nvme.BlockMeta{Tokens: rd[0].Meta.Tokens[:0]}}
				if err := s2.ReadBatch(ctx, rd[:]); err != nil {
					return err
				}
				if rd[0].Err != nil {
					return rd[0].Err
				}
				if !rd[0].Deferred {
					return fmt.Errorf("slot %d: the store checked a word-summed payload itself", rd[0].Slot)
				}
				want = append(want, rd[0].Check.WordSum)
			}
			sums, err := w.toDevice(n, tier)
			if err != nil {
				return err
			}
			for j := range want {
				if sums[j] != want[j] {
					return fmt.Errorf("slot %d: the GPU's word sum %#x is not the header's %#x", slots2[batch[j]], sums[j], want[j])
				}
			}
		}
	}
	// one pass over all slots, in order, with depth goroutines; returns GiB/s.
	pass := func(write, random bool, m mode) (float64, error) {
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
			buf, hdr := bufs[g], hdrs[g]
			if m == modeRawCopy || m == modeTierGPU {
				wg.Go(func() {
					if err := gpuPass(gpu.workers[g], &next, order, write, m); err != nil {
						once.Do(func() { firstErr = err })
					}
				})
				continue
			}
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
					case m == modeTier && write:
						err = s.Write(ctx, slot, nvme.BlockMeta{Key: uint64(slot) + 1, Parent: uint64(slot), Salt: 1}, buf)
					case m == modeTier:
						_, err = s.Read(ctx, slot, buf)
					case write:
						err = full(unix.Pwrite, raw, buf, payloadOff(slot))
					case m == modeRawHdr:
						err = fullv(raw, hdr, buf, payloadOff(slot)-int64(info.HeaderBytes))
					case m == modeRawTouch && write:
						touched.Add(int64(bytes.Count(buf, touchByte)))
						err = full(unix.Pwrite, raw, buf, payloadOff(slot))
					case m == modeRawTouch:
						err = full(unix.Pread, raw, buf, payloadOff(slot))
						touched.Add(int64(bytes.Count(buf, touchByte)))
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
	if _, err := pass(true, false, modeTier); err != nil {
		return "", err
	}
	if gpu != nil {
		if _, err := pass(true, false, modeTierGPU); err != nil {
			return "", err
		}
	}
	type key struct {
		c int
		m mode
	}
	samples := map[key][]float64{}
	reqs := map[key]diskDelta{}
	cpu := map[key]time.Duration{}
	cpuSamples := map[key][]float64{} // µs per block, one per round
	for r := range rounds {
		for c, cs := range cases {
			for i := range numModes {
				m := (mode(r) + i) % numModes
				if m == modeRawHdr && cs.write {
					continue // it would overwrite the tier's headers
				}
				if (m == modeRawCopy || m == modeTierGPU) && gpu == nil {
					continue
				}
				before, cpu0 := dev.read(), cpuTime()
				v, err := pass(cs.write, cs.random, m)
				used := cpuTime() - cpu0
				cpu[key{c, m}] += used
				cpuSamples[key{c, m}] = append(cpuSamples[key{c, m}], float64(used.Nanoseconds())/1e3/float64(nslots))
				if err != nil {
					return "", fmt.Errorf("%s (%s): %w", cs.name, modeNames[m], err)
				}
				k := key{c, m}
				samples[k] = append(samples[k], v)
				reqs[k] = reqs[k].add(dev.read().sub(before, cs.write))
			}
		}
	}
	if st := s.Stats(); st.CorruptDrops != 0 {
		return "", fmt.Errorf("the tier dropped %d corrupt slots during the run", st.CorruptDrops)
	}
	if s2 != nil {
		if st := s2.Stats(); st.CorruptDrops != 0 || st.DeferredChecks == 0 {
			return "", fmt.Errorf("the GPU-summed tier dropped %d corrupt slots and deferred %d checks during the run", st.CorruptDrops, st.DeferredChecks)
		}
	}
	blocks := float64(nslots * rounds)
	for c, cs := range cases {
		base := fmt.Sprintf("raw O_DIRECT %s %s", cs.name, bytesize.Format(int64(bs)))
		res.Add(base, "GiB/s", samples[key{c, modeRaw}], "")
		if !cs.write {
			r := res.Add(fmt.Sprintf("raw O_DIRECT+header %s %s", cs.name, bytesize.Format(int64(bs))), "GiB/s", samples[key{c, modeRawHdr}], base)
			r.Note = "diagnostic: the tier's bytes (header region + payload) in one raw preadv"
			res.Rows[len(res.Rows)-1] = r
		}
		r := res.Add(fmt.Sprintf("raw O_DIRECT+touch %s %s", cs.name, bytesize.Format(int64(bs))), "GiB/s", samples[key{c, modeRawTouch}], base)
		r.Note = "diagnostic: raw, plus one SIMD pass over the payload's bytes (the floor of any full checksum)"
		res.Rows[len(res.Rows)-1] = r
		res.Add(fmt.Sprintf("kvtier/nvme %s %s", cs.name, bytesize.Format(int64(bs))), "GiB/s", samples[key{c, modeTier}], base)
		cpuBase := fmt.Sprintf("raw O_DIRECT %s %s CPU", cs.name, bytesize.Format(int64(bs)))
		res.Add(cpuBase, "CPU µs/block", cpuSamples[key{c, modeRaw}], "")
		r = res.Add(fmt.Sprintf("raw O_DIRECT+touch %s %s CPU", cs.name, bytesize.Format(int64(bs))), "CPU µs/block", cpuSamples[key{c, modeRawTouch}], cpuBase)
		r.Note = "diagnostic: raw plus one pass over the payload"
		res.Rows[len(res.Rows)-1] = r
		tierCPU := res.Add(fmt.Sprintf("kvtier/nvme %s %s CPU", cs.name, bytesize.Format(int64(bs))), "CPU µs/block", cpuSamples[key{c, modeTier}], cpuBase)
		note += fmt.Sprintf("; %s tier CPU per block %.2fx raw's (medians of rounds)", cs.name, 1/tierCPU.Ratio)
		if gpu != nil {
			copyName := fmt.Sprintf("raw O_DIRECT+copy %s %s", cs.name, bytesize.Format(int64(bs)))
			r = res.Add(copyName, "GiB/s", samples[key{c, modeRawCopy}], base)
			r.Note = "raw, plus the payload's copy to or from the GPU (what any GPU server adds), no checksum"
			res.Rows[len(res.Rows)-1] = r
			res.Add(fmt.Sprintf("kvtier/nvme, GPU sums %s %s", cs.name, bytesize.Format(int64(bs))), "GiB/s", samples[key{c, modeTierGPU}], base)
			r = res.Add(copyName+" CPU", "CPU µs/block", cpuSamples[key{c, modeRawCopy}], cpuBase)
			r.Note = "raw plus the copy to or from the GPU"
			res.Rows[len(res.Rows)-1] = r
			g := res.Add(fmt.Sprintf("kvtier/nvme, GPU sums %s %s CPU", cs.name, bytesize.Format(int64(bs))), "CPU µs/block", cpuSamples[key{c, modeTierGPU}], cpuBase)
			note += fmt.Sprintf("; %s tier with GPU sums CPU per block %.2fx raw's", cs.name, 1/g.Ratio)
		}
		note += fmt.Sprintf("; %s CPU µs per block (user+system, this process):", cs.name)
		for m := range numModes {
			if d, ok := cpu[key{c, m}]; ok {
				note += fmt.Sprintf(" %s %.1f,", modeNames[m], float64(d.Microseconds())/blocks)
			}
		}
		note = strings.TrimSuffix(note, ",")
		if dev.ok() {
			note += fmt.Sprintf("; %s device requests per block:", cs.name)
			for m := range numModes {
				if d, ok := reqs[key{c, m}]; ok {
					note += fmt.Sprintf(" %s %s,", modeNames[m], d.per(blocks))
				}
			}
			note = strings.TrimSuffix(note, ",")
		}
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
