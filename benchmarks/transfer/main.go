// Command transfer measures kvtier's copy engine against the baselines in one
// run on a GPU machine: blocks scattered on the GPU and contiguous in a
// pinned host pool, 1 GiB per transfer, host to device, device to host and
// both at once; the engine (by default, and with each submission method
// forced) against a loop of per-block cuMemcpyAsync and against one large
// copy of the same bytes. It also measures how much an onboard slows a
// compute kernel on the server's stream.
//
//	go build -o .gpu/ ./benchmarks/transfer
//	.gpu/transfer --machine h200 --out benchmarks/results
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/transfer"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "transfer:", err)
		os.Exit(1)
	}
}

type bench struct {
	dev          cudastream.Device
	total        int64
	gpuA, gpuB   cudastream.DevicePtr // scatter regions, 4x total each
	gpuRegion    int64
	poolA, poolB []byte // pinned, total bytes each
	sA, sB       cudastream.Stream
	evA, evB     cudastream.Event
}

func run() error {
	var (
		device  = flag.Int("device", 0, "CUDA device ordinal")
		sizes   = flag.String("sizes", "16KiB,64KiB,256KiB,2MiB", "block sizes")
		totalS  = flag.String("total", "1GiB", "bytes per transfer")
		rounds  = flag.Int("rounds", 5, "measured rounds per case (after one warm-up)")
		out     = flag.String("out", "benchmarks/results", "directory for the results")
		machine = flag.String("machine", "h200", "machine name for the results file")
		commit  = flag.String("commit", "", "commit the binary was built from")
		batch   = flag.Int("max-batch", 0, "descriptors per batched call (0: the engine's default)")
		ctas    = flag.Int("kernel-ctas", 0, "CTAs of the copy kernel (0: cudastream's default)")
		threads = flag.Int("kernel-threads", 0, "threads per CTA of the copy kernel (0: cudastream's default)")
		fma     = flag.Int("fma-iters", 1<<19, "iterations of the FMA kernel in the overlap measurement")
		skipOv  = flag.Bool("no-overlap", false, "skip the overlap measurement")
	)
	flag.Parse()
	total, err := parseBytes(*totalS)
	if err != nil {
		return fmt.Errorf("--total: %w", err)
	}
	var blockSizes []int64
	for _, s := range strings.Split(*sizes, ",") {
		n, err := parseBytes(s)
		if err != nil {
			return fmt.Errorf("--sizes: %w", err)
		}
		if total%n != 0 {
			return fmt.Errorf("--sizes: block size %d does not divide --total %d", n, total)
		}
		blockSizes = append(blockSizes, n)
	}
	if *rounds < 1 {
		return fmt.Errorf("--rounds must be at least 1, got %d", *rounds)
	}

	dev, err := cudastream.Open(*device)
	if err != nil {
		return err
	}
	defer dev.Close()
	info := dev.Info()
	res := results.New("transfer", *machine, *commit)
	res.Notes = append(res.Notes,
		fmt.Sprintf("device: %s, driver %d, PCIe gen %d x%d, batched copies: %v", info.Name, info.DriverVersion, info.PCIeGen, info.PCIeWidth, info.BatchCopy),
		fmt.Sprintf("%d bytes per transfer; blocks scattered at random over a %d-byte device region, contiguous in a pinned (cuMemHostAlloc) pool", total, 4*total),
		fmt.Sprintf("each case: one warm-up, then %d rounds with the order of the engine's methods / per-block loop / one large copy rotated each round; GiB/s = bytes / wall time from first submission to completion", *rounds),
		"engine-auto is the engine's default (Config.Method = MethodAuto); engine-kernel forces the copy kernel (SMs read/write the pinned pool), engine-batch forces cuMemcpyBatchAsync",
		fmt.Sprintf("copy kernel: %d CTAs x %d threads (0: defaults %d x %d); overlap: kvtier_fma, %d iterations per thread in one wave of 4 CTAs x 256 threads per SM, an eighth of that in 32 CTAs per SM",
			*ctas, *threads, cudastream.DefaultKernelCTAs, cudastream.DefaultKernelThreadsPerCTA, *fma))

	b := &bench{dev: dev, total: total, gpuRegion: 4 * total}
	if err := b.setup(); err != nil {
		return err
	}
	defer b.teardown()

	base := transfer.Config{MaxBatch: *batch, KernelCopy: cudastream.KernelCopyOptions{CTAs: *ctas, ThreadsPerCTA: *threads}}
	for _, bs := range blockSizes {
		if err := b.size(res, bs, *rounds, base); err != nil {
			return fmt.Errorf("block size %d: %w", bs, err)
		}
	}
	if !*skipOv {
		if err := b.overlap(res, *rounds, *fma, base); err != nil {
			return fmt.Errorf("overlap: %w", err)
		}
	}
	if err := res.Write(*out); err != nil {
		return err
	}
	return res.Markdown(os.Stdout)
}

func (b *bench) setup() error {
	var err error
	if b.gpuA, err = b.dev.Alloc(b.gpuRegion); err != nil {
		return err
	}
	if b.gpuB, err = b.dev.Alloc(b.gpuRegion); err != nil {
		return err
	}
	if b.poolA, err = b.dev.HostAlloc(b.total); err != nil {
		return err
	}
	if b.poolB, err = b.dev.HostAlloc(b.total); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(b.poolA); i += 8 {
		v := rng.Uint64()
		for k := 0; k < 8; k++ {
			b.poolA[i+k] = byte(v >> (8 * k))
		}
	}
	copy(b.poolB, b.poolA)
	if b.sA, err = b.dev.NewStream(0); err != nil {
		return err
	}
	if b.sB, err = b.dev.NewStream(0); err != nil {
		return err
	}
	if b.evA, err = b.dev.NewEvent(cudastream.EventOptions{}); err != nil {
		return err
	}
	b.evB, err = b.dev.NewEvent(cudastream.EventOptions{})
	return err
}

func (b *bench) teardown() {
	for _, s := range []cudastream.Stream{b.sA, b.sB} {
		if s != nil {
			s.Destroy()
		}
	}
	for _, e := range []cudastream.Event{b.evA, b.evB} {
		if e != nil {
			e.Destroy()
		}
	}
	for _, p := range [][]byte{b.poolA, b.poolB} {
		if p != nil {
			b.dev.HostFree(p)
		}
	}
	for _, p := range []cudastream.DevicePtr{b.gpuA, b.gpuB} {
		if p != 0 {
			b.dev.Free(p)
		}
	}
}

// engines builds one engine per direction's region: A moves poolA <-> gpuA,
// B moves poolB <-> gpuB, so that "both at once" uses disjoint memory.
func (b *bench) engines(bs int64, cfg transfer.Config) (ea, eb *transfer.Engine, err error) {
	mk := func(base cudastream.DevicePtr, pool []byte) (*transfer.Engine, error) {
		g, err := transfer.BlockFirstLayout(base, 1, 1, int(b.gpuRegion/bs), bs)
		if err != nil {
			return nil, err
		}
		c := cfg
		c.GPU, c.Host = g, transfer.HostLayout{Pool: pool, SlotBytes: bs}
		return transfer.New(b.dev, c)
	}
	if ea, err = mk(b.gpuA, b.poolA); err != nil {
		return nil, nil, err
	}
	if eb, err = mk(b.gpuB, b.poolB); err != nil {
		ea.Close()
		return nil, nil, err
	}
	return ea, eb, nil
}

// scatter picks n distinct GPU blocks among the region's, in random order,
// for host slots 0..n-1.
func scatter(n, blocks int, seed uint64) []transfer.Pair {
	rng := rand.New(rand.NewPCG(seed, 7))
	perm := rng.Perm(blocks)[:n]
	pairs := make([]transfer.Pair, n)
	for i := range pairs {
		pairs[i] = transfer.Pair{GPUBlock: int32(perm[i]), HostSlot: int32(i)}
	}
	return pairs
}

type direction int

const (
	htod direction = iota
	dtoh
	both
)

func (d direction) String() string { return [...]string{"HtoD", "DtoH", "both"}[d] }

// engineMethods are the engine's rows: what the engine does by default
// (auto), and each submission method forced.
var engineMethods = []transfer.Method{transfer.MethodAuto, transfer.MethodKernel, transfer.MethodBatch} // size() relies on this order

func (b *bench) size(res *results.File, bs int64, rounds int, base transfer.Config) error {
	type pair struct{ a, b *transfer.Engine }
	engs := make([]pair, len(engineMethods))
	for i, m := range engineMethods {
		cfg := base
		cfg.Method = m
		ea, eb, err := b.engines(bs, cfg)
		if err != nil {
			return fmt.Errorf("engine %v: %w", m, err)
		}
		defer ea.Close()
		defer eb.Close()
		engs[i] = pair{ea, eb}
	}
	n := int(b.total / bs)
	pairsA := scatter(n, int(b.gpuRegion/bs), uint64(bs))
	pairsB := scatter(n, int(b.gpuRegion/bs), uint64(bs)+1)
	for i, m := range engineMethods {
		if err := b.verify(engs[i].a, pairsA, bs, m); err != nil {
			return fmt.Errorf("engine %v: %w", m, err)
		}
	}
	label := sizeLabel(bs)
	for _, dir := range []direction{htod, dtoh, both} {
		type bcase struct {
			name string
			fn   func() (time.Duration, error)
		}
		var cases []bcase
		for i, m := range engineMethods {
			ea, eb := engs[i].a, engs[i].b
			cases = append(cases, bcase{"engine-" + m.String(), func() (time.Duration, error) { return b.runEngine(dir, ea, eb, pairsA, pairsB) }})
		}
		nEngine := len(cases)
		if dir == both {
			// Onboard by the copy kernel, offload by batches: the copy
			// engines and the SMs each carry one direction.
			ea, eb := engs[1].a, engs[2].b
			cases = append(cases, bcase{"engine-kernel-onboard+batch-offload", func() (time.Duration, error) { return b.runEngine(dir, ea, eb, pairsA, pairsB) }})
			nEngine++
		}
		cases = append(cases,
			bcase{"per-block loop", func() (time.Duration, error) { return b.runLoop(dir, pairsA, pairsB, bs) }},
			bcase{"one large copy", func() (time.Duration, error) { return b.runLarge(dir) }})
		samples := make([][]float64, len(cases))
		bytes := float64(b.total)
		if dir == both {
			bytes *= 2
		}
		for r := -1; r < rounds; r++ { // r == -1 is the warm-up
			for k := range cases {
				idx := (k + max(r, 0)) % len(cases) // rotate the order each round
				c := cases[idx]
				d, err := c.fn()
				if err != nil {
					return fmt.Errorf("%s %s: %w", dir, c.name, err)
				}
				if r >= 0 {
					samples[idx] = append(samples[idx], bytes/d.Seconds()/(1<<30))
				}
			}
		}
		loop, large := len(cases)-2, len(cases)-1
		loopName := fmt.Sprintf("%s %s per-block loop", dir, label)
		largeName := fmt.Sprintf("%s %s one large copy", dir, label)
		res.Add(loopName, "GiB/s", samples[loop], "")
		res.Add(largeName, "GiB/s", samples[large], "")
		for i := 0; i < nEngine; i++ {
			res.Add(fmt.Sprintf("%s %s %s vs loop", dir, label, cases[i].name), "GiB/s", samples[i], loopName)
			res.Add(fmt.Sprintf("%s %s %s vs large copy", dir, label, cases[i].name), "GiB/s", samples[i], largeName)
		}
	}
	return nil
}

// verify onboards pool A's blocks with ea, offloads them into pool B by the
// same method and compares every byte.
func (b *bench) verify(ea *transfer.Engine, pairs []transfer.Pair, bs int64, m transfer.Method) error {
	ctx := context.Background()
	t, err := ea.Onboard(ctx, pairs)
	if err != nil {
		return err
	}
	if err := t.Wait(ctx); err != nil {
		return err
	}
	t.Release()
	clear(b.poolB)
	g, _ := transfer.BlockFirstLayout(b.gpuA, 1, 1, int(b.gpuRegion/bs), bs)
	ev, err := transfer.New(b.dev, transfer.Config{GPU: g, Host: transfer.HostLayout{Pool: b.poolB, SlotBytes: bs}, Method: m})
	if err != nil {
		return err
	}
	defer ev.Close()
	t, err = ev.Offload(ctx, pairs, nil)
	if err != nil {
		return err
	}
	if err := t.Wait(ctx); err != nil {
		return err
	}
	t.Release()
	if !bytes.Equal(b.poolA, b.poolB) {
		for i := range b.poolA {
			if b.poolA[i] != b.poolB[i] {
				return fmt.Errorf("verify: byte %d differs after a round trip through scattered blocks", i)
			}
		}
	}
	return nil
}

func (b *bench) runEngine(dir direction, ea, eb *transfer.Engine, pa, pb []transfer.Pair) (time.Duration, error) {
	ctx := context.Background()
	start := time.Now()
	var ts []*transfer.Transfer
	if dir == htod || dir == both {
		t, err := ea.Onboard(ctx, pa)
		if err != nil {
			return 0, err
		}
		ts = append(ts, t)
	}
	if dir == dtoh || dir == both {
		t, err := eb.Offload(ctx, pb, nil)
		if err != nil {
			return 0, err
		}
		ts = append(ts, t)
	}
	var errs []error
	for _, t := range ts {
		errs = append(errs, t.Wait(ctx))
		t.Release()
	}
	return time.Since(start), errors.Join(errs...)
}

func (b *bench) runLoop(dir direction, pa, pb []transfer.Pair, bs int64) (time.Duration, error) {
	start := time.Now()
	var wg sync.WaitGroup
	var errA, errB error
	if dir == htod || dir == both {
		wg.Go(func() {
			for _, p := range pa {
				off := int64(p.HostSlot) * bs
				if errA = b.sA.CopyHtoD(b.gpuA+cudastream.DevicePtr(int64(p.GPUBlock)*bs), b.poolA[off:off+bs]); errA != nil {
					return
				}
			}
			errA = b.sA.Synchronize()
		})
	}
	if dir == dtoh || dir == both {
		wg.Go(func() {
			for _, p := range pb {
				off := int64(p.HostSlot) * bs
				if errB = b.sB.CopyDtoH(b.poolB[off:off+bs], b.gpuB+cudastream.DevicePtr(int64(p.GPUBlock)*bs)); errB != nil {
					return
				}
			}
			errB = b.sB.Synchronize()
		})
	}
	wg.Wait()
	return time.Since(start), errors.Join(errA, errB)
}

func (b *bench) runLarge(dir direction) (time.Duration, error) {
	start := time.Now()
	var errA, errB error
	if dir == htod || dir == both {
		errA = b.sA.CopyHtoD(b.gpuA, b.poolA)
	}
	if dir == dtoh || dir == both {
		errB = b.sB.CopyDtoH(b.poolB, b.gpuB)
	}
	if dir == htod || dir == both {
		errA = errors.Join(errA, b.sA.Synchronize())
	}
	if dir == dtoh || dir == both {
		errB = errors.Join(errB, b.sB.Synchronize())
	}
	return time.Since(start), errors.Join(errA, errB)
}

// overlap measures a compute kernel (kvtier_fma: FMA chains over all SMs,
// cudastream.ComputeLoader) on its own compute stream, timed with events,
// alone and while the engine onboards 1 GiB: of 16 KiB blocks (the copy
// kernel takes SMs) and of 2 MiB blocks (batches on the copy engines). Two
// shapes of compute: one wave of 4 CTAs per SM (every SM's share fixed up
// front, as in a persistent kernel) and 32 CTAs per SM (waves, as a large
// GEMM or attention kernel runs). Each is sized to take about half the
// onboard, so that it runs entirely inside it.
func (b *bench) overlap(res *results.File, rounds, fmaIters int, base transfer.Config) error {
	compute, err := b.dev.NewStream(0)
	if err != nil {
		return err
	}
	defer compute.Destroy()
	cl, ok := compute.(cudastream.ComputeLoader)
	if !ok {
		return fmt.Errorf("the device's streams (%T) cannot launch the FMA kernel", compute)
	}
	t0, err := b.dev.NewEvent(cudastream.EventOptions{Timing: true})
	if err != nil {
		return err
	}
	defer t0.Destroy()
	t1, err := b.dev.NewEvent(cudastream.EventOptions{Timing: true})
	if err != nil {
		return err
	}
	defer t1.Destroy()
	kernel := func(ctasPerSM, iters int) (time.Duration, error) {
		if err := t0.Record(compute); err != nil {
			return 0, err
		}
		if err := cl.LaunchFMA(ctasPerSM, iters); err != nil {
			return 0, err
		}
		if err := t1.Record(compute); err != nil {
			return 0, err
		}
		if err := t1.Synchronize(); err != nil {
			return 0, err
		}
		return t1.Elapsed(t0)
	}
	ctx := context.Background()
	for _, shape := range []struct {
		name             string
		ctasPerSM, iters int
	}{
		{"1 wave, 4 CTAs/SM", 4, fmaIters},
		{"waves, 32 CTAs/SM", 32, fmaIters / 8},
	} {
		aloneName := fmt.Sprintf("compute (FMA, %s) alone", shape.name)
		for _, bs := range []int64{16 << 10, 2 << 20} {
			ea, eb, err := b.engines(bs, base)
			if err != nil {
				return err
			}
			pairs := scatter(int(b.total/bs), int(b.gpuRegion/bs), 99)
			var alone, shared, onboard []float64
			for r := -1; r < rounds; r++ {
				for k := 0; k < 2; k++ {
					withOnboard := (k+max(r, 0))%2 == 1
					var tr *transfer.Transfer
					start := time.Now()
					if withOnboard {
						if tr, err = ea.Onboard(ctx, pairs); err != nil {
							return err
						}
					}
					d, err := kernel(shape.ctasPerSM, shape.iters)
					if err != nil {
						return err
					}
					if tr != nil {
						if err := tr.Wait(ctx); err != nil {
							return err
						}
						tr.Release()
					}
					if r < 0 {
						continue
					}
					if withOnboard {
						shared = append(shared, d.Seconds()*1e3)
						onboard = append(onboard, float64(b.total)/time.Since(start).Seconds()/(1<<30))
					} else {
						alone = append(alone, d.Seconds()*1e3)
					}
				}
			}
			ea.Close()
			eb.Close()
			if bs == 16<<10 {
				res.Add(aloneName, "ms", alone, "")
			}
			res.Add(fmt.Sprintf("compute (FMA, %s) during a 1 GiB onboard of %s blocks (%s)", shape.name, sizeLabel(bs), methodFor(bs, base)), "ms", shared, aloneName)
			res.Add(fmt.Sprintf("the 1 GiB onboard of %s blocks during compute (FMA, %s)", sizeLabel(bs), shape.name), "GiB/s", onboard, "")
		}
	}
	return nil
}

// methodFor names what MethodAuto does with blocks of bs bytes.
func methodFor(bs int64, cfg transfer.Config) string {
	below := cfg.KernelBelowBytes
	if below == 0 {
		below = transfer.DefaultKernelBelowBytes
	}
	if bs < below {
		return "copy kernel"
	}
	return "cuMemcpyBatchAsync"
}

func sizeLabel(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("bad size %q: want a positive number with an optional KiB/MiB/GiB suffix", s)
	}
	return n * mult, nil
}
