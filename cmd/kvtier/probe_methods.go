package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/bytesize"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/transfer"
)

// probe --methods measures where kvtier/transfer's MethodAuto should switch
// on this GPU: it moves blocks scattered over a device region four times
// the transfer, to and from contiguous (or, for the gather switch, partly
// contiguous) pinned slots, by each method forced, one way and both ways
// at once, and reads the switch points off the medians.

// probeMethodSizes are the block sizes measured.
var probeMethodSizes = []int64{16 << 10, 64 << 10, 256 << 10, 2 << 20}

// probeGatherRuns are the host runs the gather switch is measured at, in
// bytes: the slots of a transfer in runs of this many consecutive bytes,
// the runs in random order.
var probeGatherRuns = []int64{256 << 10, 1 << 20, 4 << 20, 16 << 20}

// probeSwitches is what --methods concludes, in transfer.Config's terms.
type probeSwitches struct {
	// KernelBelowBytes: one way, the copy kernel is faster below it and
	// batches from it (the first measured size where batches win both
	// ways; twice the largest when they never do).
	KernelBelowBytes int64 `json:"kernel_below_bytes"`
	// OnboardContendedKernelBelowBytes: both ways at once, an onboard by
	// the kernel beside batched offloads is faster below it.
	OnboardContendedKernelBelowBytes int64 `json:"onboard_contended_kernel_below_bytes"`
	// GatherMinRunBytes: both ways at once in the smallest blocks, the
	// gather/scatter path beats the best direct pair from host runs of this
	// size (0 with GatherPays false: it never did at the runs measured).
	GatherMinRunBytes int64 `json:"gather_min_run_bytes"`
	GatherPays        bool  `json:"gather_pays"`
	// GatherBelowBytes: both ways at once from contiguous slots, the first
	// measured size where the best direct pair matches gather/scatter
	// (twice the largest when it never does).
	GatherBelowBytes int64 `json:"gather_below_bytes"`
}

// probeMethodBench holds the memory and engines of one block size.
type probeMethodBench struct {
	d     cudastream.Device
	total int64
	gpu   cudastream.DevicePtr // two regions of 4*total: onboards into the first, offloads from the second
	pool  []byte               // two halves of total: onboards from the first, offloads into the second
	rng   *rand.Rand
	runs  int
}

// probeMethods runs the measurement on d with transfers of total bytes and
// adds its rows to res.
func probeMethods(d cudastream.Device, total int64, runs int, res *results.File) (probeSwitches, error) {
	var sizes []int64 // the block sizes a transfer of total bytes holds 4 or more of
	for _, bs := range probeMethodSizes {
		if total%bs == 0 && total/bs >= 4 {
			sizes = append(sizes, bs)
		}
	}
	if len(sizes) == 0 {
		return probeSwitches{}, fmt.Errorf("--methods: --size %s is not a multiple of 4 blocks of any size measured (%s to %s)",
			bytesize.Format(total), bytesize.Format(probeMethodSizes[0]), bytesize.Format(probeMethodSizes[len(probeMethodSizes)-1]))
	}
	b := &probeMethodBench{d: d, total: total, runs: runs, rng: rand.New(rand.NewPCG(5, 5))}
	var err error
	if b.gpu, err = d.Alloc(8 * total); err != nil {
		return probeSwitches{}, fmt.Errorf("--methods: device region of %s: %w", bytesize.Format(8*total), err)
	}
	defer d.Free(b.gpu)
	if b.pool, err = d.HostAlloc(2 * total); err != nil {
		return probeSwitches{}, fmt.Errorf("--methods: pinned pool of %s: %w", bytesize.Format(2*total), err)
	}
	defer d.HostFree(b.pool)
	fig := map[string]float64{}
	for _, bs := range sizes {
		if err := b.size(bs, fig, res); err != nil {
			return probeSwitches{}, fmt.Errorf("--methods: %s blocks: %w", bytesize.Format(bs), err)
		}
	}
	return probeDeriveSwitches(fig), nil
}

// probeMethodKey names a figure: the block size, what moved (HtoD, DtoH or
// both), the methods and the host run ("" for contiguous slots).
func probeMethodKey(bs int64, what, methods string, run int64) string {
	k := fmt.Sprintf("%s %s %s", bytesize.Format(bs), what, methods)
	if run > 0 {
		k += " host runs of " + bytesize.Format(run)
	}
	return k
}

func (b *probeMethodBench) size(bs int64, fig map[string]float64, res *results.File) error {
	engs := map[transfer.Method]*transfer.Engine{}
	for _, m := range []transfer.Method{transfer.MethodKernel, transfer.MethodBatch, transfer.MethodGather} {
		g, err := transfer.BlockFirstLayout(b.gpu, 1, 1, int(8*b.total/bs), bs)
		if err != nil {
			return err
		}
		cfg := transfer.Config{GPU: g, Host: transfer.HostLayout{Pool: b.pool, SlotBytes: bs}, Method: m}
		if m == transfer.MethodGather {
			// The default ring, or a smaller one for a small --size.
			cfg.GatherBuffers = transfer.DefaultGatherBuffers
			cfg.GatherBufferBytes = max(min(transfer.DefaultGatherBufferBytes, b.total/4), bs)
		}
		e, err := transfer.New(b.d, cfg)
		if err != nil {
			return fmt.Errorf("engine %v: %w", m, err)
		}
		defer e.Close()
		engs[m] = e
	}
	n := int(b.total / bs)
	type mcase struct {
		key     string
		on, off *transfer.Engine
		run     int64
	}
	kern, batch, gather := engs[transfer.MethodKernel], engs[transfer.MethodBatch], engs[transfer.MethodGather]
	cases := []mcase{
		{probeMethodKey(bs, "HtoD", "kernel", 0), kern, nil, 0},
		{probeMethodKey(bs, "HtoD", "batch", 0), batch, nil, 0},
		{probeMethodKey(bs, "HtoD", "gather", 0), gather, nil, 0},
		{probeMethodKey(bs, "DtoH", "kernel", 0), nil, kern, 0},
		{probeMethodKey(bs, "DtoH", "batch", 0), nil, batch, 0},
		{probeMethodKey(bs, "DtoH", "gather", 0), nil, gather, 0},
		{probeMethodKey(bs, "both", "kernel+kernel", 0), kern, kern, 0},
		{probeMethodKey(bs, "both", "kernel+batch", 0), kern, batch, 0},
		{probeMethodKey(bs, "both", "batch+batch", 0), batch, batch, 0},
	}
	if bs == probeMethodSizes[0] {
		for _, run := range probeGatherRuns {
			cases = append(cases, mcase{probeMethodKey(bs, "both", "gather+gather", run), gather, gather, run})
		}
	} else {
		cases = append(cases, mcase{probeMethodKey(bs, "both", "gather+gather", 0), gather, gather, 0})
	}
	gpuBlocks := int(4 * b.total / bs)
	samples := make([][]float64, len(cases))
	for r := -1; r < b.runs; r++ {
		for k := range cases {
			idx := (k + max(r, 0)) % len(cases) // rotate the order each round
			c := cases[idx]
			on := b.pairs(0, n, gpuBlocks, bs, c.run)
			off := b.pairs(1, n, gpuBlocks, bs, c.run)
			d, bytes, err := b.timed(c.on, c.off, on, off)
			if err != nil {
				return fmt.Errorf("%s: %w", c.key, err)
			}
			if r >= 0 {
				samples[idx] = append(samples[idx], float64(bytes)/d.Seconds()/(1<<30))
			}
		}
	}
	for i, c := range cases {
		res.Add("methods "+c.key, "GiB/s", samples[i], "")
		fig[c.key] = results.Median(samples[i])
	}
	return nil
}

// pairs maps n blocks scattered at random over region h's gpuBlocks to
// half h of the pool: consecutive slots, or runs of run bytes in random
// order.
func (b *probeMethodBench) pairs(h, n, gpuBlocks int, bs, run int64) []transfer.Pair {
	perm := b.rng.Perm(gpuBlocks)[:n]
	slots := make([]int32, n)
	for i := range slots {
		slots[i] = int32(i)
	}
	if per := int(run / bs); run > 0 && per >= 1 && per < n {
		runs := n / per
		order := b.rng.Perm(runs)
		for i := range slots[:runs*per] {
			slots[i] = int32(order[i/per]*per + i%per)
		}
	}
	p := make([]transfer.Pair, n)
	for i := range p {
		p[i] = transfer.Pair{GPUBlock: int32(h*gpuBlocks + perm[i]), HostSlot: int32(h*n) + slots[i]}
	}
	return p
}

// timed onboards on with on and offloads off with off (either engine nil
// for none), both submitted before either is waited for.
func (b *probeMethodBench) timed(on, off *transfer.Engine, pa, pb []transfer.Pair) (time.Duration, int64, error) {
	ctx := context.Background()
	start := time.Now()
	var ts []*transfer.Transfer
	if on != nil {
		t, err := on.Onboard(ctx, pa)
		if err != nil {
			return 0, 0, err
		}
		ts = append(ts, t)
	}
	if off != nil {
		t, err := off.Offload(ctx, pb)
		if err != nil {
			return 0, 0, err
		}
		ts = append(ts, t)
	}
	var bytes int64
	var errs error
	for _, t := range ts {
		if err := t.Wait(ctx); err != nil && errs == nil {
			errs = err
		}
		bytes += t.Bytes()
		t.Release()
	}
	return time.Since(start), bytes, errs
}

// probeDeriveSwitches reads the switch points off the figures.
func probeDeriveSwitches(fig map[string]float64) probeSwitches {
	var sw probeSwitches
	var sizes []int64
	for _, bs := range probeMethodSizes {
		if _, ok := fig[probeMethodKey(bs, "HtoD", "kernel", 0)]; ok {
			sizes = append(sizes, bs)
		}
	}
	if len(sizes) == 0 {
		return sw
	}
	first := func(wins func(bs int64) bool) int64 {
		for _, bs := range sizes {
			if wins(bs) {
				return bs
			}
		}
		return 2 * sizes[len(sizes)-1]
	}
	get := func(bs int64, what, m string, run int64) float64 { return fig[probeMethodKey(bs, what, m, run)] }
	sw.KernelBelowBytes = first(func(bs int64) bool {
		return get(bs, "HtoD", "batch", 0) >= get(bs, "HtoD", "kernel", 0) && get(bs, "DtoH", "batch", 0) >= get(bs, "DtoH", "kernel", 0)
	})
	sw.OnboardContendedKernelBelowBytes = first(func(bs int64) bool {
		return get(bs, "both", "batch+batch", 0) >= get(bs, "both", "kernel+batch", 0)
	})
	direct := func(bs int64) float64 {
		return max(get(bs, "both", "kernel+kernel", 0), get(bs, "both", "kernel+batch", 0), get(bs, "both", "batch+batch", 0))
	}
	sw.GatherBelowBytes = first(func(bs int64) bool { return direct(bs) >= get(bs, "both", "gather+gather", 0) })
	bs := sizes[0]
	for _, run := range probeGatherRuns {
		if v, ok := fig[probeMethodKey(bs, "both", "gather+gather", run)]; ok && v > direct(bs) {
			sw.GatherPays, sw.GatherMinRunBytes = true, run
			break
		}
	}
	return sw
}

// probePrintSwitches says what the switches are and how to use them.
func probePrintSwitches(w io.Writer, sw probeSwitches) {
	fmt.Fprintf(w, "\nswitch points on this GPU (transfer.Config):\n")
	fmt.Fprintf(w, "  KernelBelowBytes                  %s  (one way: the copy kernel below, batches from there)\n", bytesize.Format(sw.KernelBelowBytes))
	fmt.Fprintf(w, "  OnboardContendedKernelBelowBytes  %s  (an onboard beside batched offloads)\n", bytesize.Format(sw.OnboardContendedKernelBelowBytes))
	if sw.GatherPays {
		fmt.Fprintf(w, "  GatherMinRunBytes                 %s  (both ways in %s blocks, gather/scatter wins from host runs of this size)\n", bytesize.Format(sw.GatherMinRunBytes), bytesize.Format(probeMethodSizes[0]))
		fmt.Fprintf(w, "  GatherBelowBytes                  %s  (both ways, direct copies match gather/scatter from blocks of this size)\n", bytesize.Format(sw.GatherBelowBytes))
	} else {
		fmt.Fprintf(w, "  gather/scatter never beat direct copies here: leave Config.GatherBuffers at 0\n")
	}
}
