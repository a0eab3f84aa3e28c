// Command transfer measures kvtier's copy engine against the baselines in one
// run on a GPU machine: blocks scattered on the GPU and contiguous in a
// pinned host pool, 1 GiB per transfer, host to device, device to host and
// both at once; the engine (by default, and with each submission method
// forced: the copy kernel, batched DMA, gather/scatter through device
// staging) against a loop of per-block cuMemcpyAsync and against one large
// copy of the same bytes. It also measures how much each method's copies
// slow a compute kernel on the server's stream, and reports the device
// staging memory each method takes.
//
// Each engine moves both directions, as a server's does, so that in the
// "both" rows MethodAuto sees the other direction's traffic: the onboard is
// submitted first, into an idle link, and the offload while it runs
// (engine-auto-offload-first reverses the order). A note per size says
// which method Auto chose for each direction.
//
//	go build -o .gpu/ ./benchmarks/transfer
//	.gpu/transfer --machine h200 --out benchmarks/results
//	.gpu/transfer --dirs both --no-overlap --out /tmp   # both ways only
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/bytesize"
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
	gpu          cudastream.DevicePtr // gpuA then gpuB
	gpuA, gpuB   cudastream.DevicePtr // scatter regions, 4x total each
	gpuRegion    int64
	pool         []byte // pinned: poolA then poolB
	poolA, poolB []byte // total bytes each
	sA, sB       cudastream.Stream
	evA, evB     cudastream.Event
	// layers and parts shape a block (1 and 1 but in the serving rows),
	// and label names the rows' block shape.
	layers, parts int
	label         func(bs int64) string
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
		dirsS   = flag.String("dirs", "HtoD,DtoH,both", "directions to measure (HtoD, DtoH, both)")
		gbufs   = flag.Int("gather-buffers", transfer.DefaultGatherBuffers, "device staging buffers per direction for the gather/scatter path (0: none)")
		gbytesS = flag.String("gather-buffer-bytes", bytesize.Format(transfer.DefaultGatherBufferBytes), "bytes per device staging buffer")
		serving = flag.Bool("serving", true, "also measure the serving shape: 2 MiB blocks of 32 layers x 2 parts (llama-3.1-8b at 16 tokens), onboarded layer by layer")
	)
	flag.Parse()
	total, err := bytesize.Parse(*totalS)
	if err != nil {
		return fmt.Errorf("--total: %w", err)
	}
	var blockSizes []int64
	for _, s := range strings.Split(*sizes, ",") {
		n, err := bytesize.Parse(s)
		if err != nil {
			return fmt.Errorf("--sizes: %w", err)
		}
		if total%n != 0 {
			return fmt.Errorf("--sizes: block size %d does not divide --total %d", n, total)
		}
		blockSizes = append(blockSizes, n)
	}
	gbytes, err := bytesize.Parse(*gbytesS)
	if err != nil {
		return fmt.Errorf("--gather-buffer-bytes: %w", err)
	}
	dirs, err := parseDirs(*dirsS)
	if err != nil {
		return fmt.Errorf("--dirs: %w", err)
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
		"one engine moves both directions (onboard into the first device region from the first half of the pool, offload from the second region to the second half); both at once: one goroutine submits the onboard, then the offload while it runs, except in engine-auto-offload-first (the reverse) and engine-auto-concurrent (each from its own goroutine at once, as a server's request path and write-back do); a note gives each submission's time",
		fmt.Sprintf("each case: one warm-up, then %d rounds with the order of the engine's methods / per-block loop / one large copy rotated each round; GiB/s = bytes / wall time from first submission to completion", *rounds),
		fmt.Sprintf("engine-auto is the engine's default (Config.Method = MethodAuto) with a device staging ring of %d x %s per direction, as kvtier.Open gives it; engine-kernel forces the copy kernel (SMs read/write the pinned pool), engine-batch forces cuMemcpyBatchAsync, engine-gather forces the gather/scatter path (the copy kernel gathers blocks into device staging, one DMA per chunk crosses the link; the reverse for onboards)", *gbufs, bytesize.Format(gbytes)),
		fmt.Sprintf("copy kernel: %d CTAs x %d threads (0: defaults %d x %d); overlap: kvtier_fma, %d iterations per thread in one wave of 4 CTAs x 256 threads per SM, an eighth of that in 32 CTAs per SM",
			*ctas, *threads, cudastream.DefaultKernelCTAs, cudastream.DefaultKernelThreadsPerCTA, *fma))

	b := newBench(dev, total)
	if err := b.setup(); err != nil {
		return err
	}
	defer b.teardown()

	base := transfer.Config{MaxBatch: *batch, KernelCopy: cudastream.KernelCopyOptions{CTAs: *ctas, ThreadsPerCTA: *threads},
		GatherBuffers: *gbufs, GatherBufferBytes: gbytes}
	for _, bs := range blockSizes {
		if err := b.size(res, bs, *rounds, base, dirs); err != nil {
			return fmt.Errorf("block size %d: %w", bs, err)
		}
	}
	if *serving {
		// A server's KV: each block holds 32 layers of K and V, 32 KiB
		// each; an onboard goes layer by layer (64 KiB pieces on each
		// side, strided by the block on the host), an offload moves
		// whole blocks.
		b.layers, b.parts = 32, 2
		b.label = func(bs int64) string { return bytesize.Format(bs) + " serving blocks (32 layers x 2 parts)" }
		res.Notes = append(res.Notes, "serving rows: 2 MiB blocks of 32 layers x 2 parts of 32 KiB, block-first on the GPU; onboards go layer by layer, offloads move whole blocks")
		if err := b.size(res, 2<<20, *rounds, base, []direction{htod, both}); err != nil {
			return fmt.Errorf("serving blocks: %w", err)
		}
		b.layers, b.parts, b.label = 1, 1, bytesize.Format
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

// newBench measures transfers of total bytes on dev, over a device region
// four times larger, in one-layer blocks.
func newBench(dev cudastream.Device, total int64) *bench {
	return &bench{dev: dev, total: total, gpuRegion: 4 * total, layers: 1, parts: 1, label: bytesize.Format}
}

// setup allocates one device region and one pinned pool, each cut in two
// halves (A and B), so that one engine can address both directions' memory.
func (b *bench) setup() error {
	var err error
	if b.gpu, err = b.dev.Alloc(2 * b.gpuRegion); err != nil {
		return err
	}
	b.gpuA, b.gpuB = b.gpu, b.gpu+cudastream.DevicePtr(b.gpuRegion)
	if b.pool, err = b.dev.HostAlloc(2 * b.total); err != nil {
		return err
	}
	b.poolA, b.poolB = b.pool[:b.total:b.total], b.pool[b.total:]
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
	if b.pool != nil {
		b.dev.HostFree(b.pool)
	}
	if b.gpu != 0 {
		b.dev.Free(b.gpu)
	}
}

// engine builds an engine over both halves of the device region and of the
// pool, in blocks of bs bytes: one engine moves both directions, as a
// server's does, so that MethodAuto sees one direction's traffic from the
// other. "Both at once" still uses disjoint memory: pairs of half A (see
// halfPairs) onboard, pairs of half B offload.
func (b *bench) engine(bs int64, cfg transfer.Config) (*transfer.Engine, error) {
	g, err := transfer.BlockFirstLayout(b.gpu, b.layers, b.parts, int(2*b.gpuRegion/bs), bs/int64(b.layers*b.parts))
	if err != nil {
		return nil, err
	}
	cfg.GPU, cfg.Host = g, transfer.HostLayout{Pool: b.pool, SlotBytes: bs}
	return transfer.New(b.dev, cfg)
}

// halfPairs picks n distinct GPU blocks at random in half h (0: A, 1: B) of
// the device region, in random order, for host slots 0..n-1 of the same
// half of the pool.
func (b *bench) halfPairs(h int, bs int64, seed uint64) []transfer.Pair {
	n, blocks := int(b.total/bs), int(b.gpuRegion/bs)
	rng := rand.New(rand.NewPCG(seed, 7))
	perm := rng.Perm(blocks)[:n]
	pairs := make([]transfer.Pair, n)
	for i := range pairs {
		pairs[i] = transfer.Pair{GPUBlock: int32(h*blocks + perm[i]), HostSlot: int32(h*n + i)}
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

func parseDirs(s string) ([]direction, error) {
	var dirs []direction
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		found := false
		for d := htod; d <= both; d++ {
			if strings.EqualFold(f, d.String()) {
				dirs, found = append(dirs, d), true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown direction %q: want HtoD, DtoH or both, separated by commas", f)
		}
	}
	return dirs, nil
}

// engineMethod is one engine row: a method, with or without the device
// staging ring.
type engineMethod struct {
	name   string
	method transfer.Method
	ring   bool
}

// engineMethods are the engine's rows: what the engine does by default
// (auto, with the ring kvtier.Open gives it), each submission method
// forced, and auto without the ring (the engine before the gather path).
// The rows with a ring need Config.GatherBuffers; without it they are left
// out. size() relies on the first three.
var engineMethods = []engineMethod{
	{"engine-auto", transfer.MethodAuto, true},
	{"engine-kernel", transfer.MethodKernel, false},
	{"engine-batch", transfer.MethodBatch, false},
	{"engine-gather", transfer.MethodGather, true},
	{"engine-auto-direct", transfer.MethodAuto, false},
}

// methods are the rows base can build.
func methods(base transfer.Config) []engineMethod {
	if base.GatherBuffers == 0 {
		return engineMethods[:3]
	}
	return engineMethods
}

// methodEngine builds the engine of one row.
func (b *bench) methodEngine(bs int64, base transfer.Config, m engineMethod) (*transfer.Engine, error) {
	cfg := base
	cfg.Method = m.method
	if !m.ring {
		cfg.GatherBuffers = 0
	}
	return b.engine(bs, cfg)
}

func (b *bench) size(res *results.File, bs int64, rounds int, base transfer.Config, dirs []direction) error {
	rows := methods(base)
	engs := make([]*transfer.Engine, len(rows))
	for i, m := range rows {
		e, err := b.methodEngine(bs, base, m)
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		defer e.Close()
		engs[i] = e
		if bs == 16<<10 {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: %s of device staging", m.name, bytesize.Format(e.GatherBytes())))
		}
	}
	pairsA := b.halfPairs(0, bs, uint64(bs))
	pairsB := b.halfPairs(1, bs, uint64(bs)+1)
	for i, m := range rows {
		if err := b.verify(engs[i], pairsA, m.name); err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
	}
	label := b.label(bs)
	for _, dir := range dirs {
		type bcase struct {
			name string
			fn   func() (time.Duration, error)
		}
		var cases []bcase
		// chose records, for each engine-auto case, which method moved
		// each direction in the last round.
		chose := map[string]string{}
		for i, m := range rows {
			e := engs[i]
			name := m.name
			cases = append(cases, bcase{name, func() (time.Duration, error) {
				return b.runEngine(dir, e, e, pairsA, pairsB, onboardFirst, chose, name, nil)
			}})
		}
		if dir == both {
			auto, kernel, batch := engs[0], engs[1], engs[2]
			cases = append(cases,
				// Onboard by the copy kernel, offload by batches: the
				// copy engines and the SMs each carry one direction.
				bcase{"engine-kernel-onboard+batch-offload", func() (time.Duration, error) {
					return b.runEngine(dir, kernel, batch, pairsA, pairsB, onboardFirst, nil, "", nil)
				}},
				bcase{"engine-batch-onboard+kernel-offload", func() (time.Duration, error) {
					return b.runEngine(dir, batch, kernel, pairsA, pairsB, onboardFirst, nil, "", nil)
				}},
				// A server's background offload is often running when an
				// onboard arrives: the offload goes first, into an idle link.
				bcase{"engine-auto-offload-first", func() (time.Duration, error) {
					return b.runEngine(dir, auto, auto, pairsA, pairsB, offloadFirst, chose, "engine-auto-offload-first", nil)
				}},
				// A server submits them from two goroutines (the request's
				// onboard, another request's write-back): neither waits
				// for the other's submission.
				bcase{"engine-auto-concurrent", func() (time.Duration, error) {
					return b.runEngine(dir, auto, auto, pairsA, pairsB, concurrent, chose, "engine-auto-concurrent", nil)
				}})
		}
		nEngine := len(cases)
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
		for _, name := range []string{"engine-auto", "engine-auto-offload-first", "engine-auto-concurrent"} {
			if c, ok := chose[name]; ok {
				res.Notes = append(res.Notes, fmt.Sprintf("%s %s %s chose (last round): %s", dir, label, name, c))
			}
		}
	}
	return nil
}

// verify onboards pool A's blocks with e, offloads the same GPU blocks into
// pool B by the same engine and compares every byte.
func (b *bench) verify(e *transfer.Engine, pairs []transfer.Pair, m string) error {
	ctx := context.Background()
	t, err := e.Onboard(ctx, pairs)
	if err != nil {
		return err
	}
	if err := t.Wait(ctx); err != nil {
		return err
	}
	t.Release()
	clear(b.poolB)
	back := make([]transfer.Pair, len(pairs))
	for i, p := range pairs {
		back[i] = transfer.Pair{GPUBlock: p.GPUBlock, HostSlot: p.HostSlot + int32(len(pairs))}
	}
	t, err = e.Offload(ctx, back, nil)
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
				return fmt.Errorf("verify (%s): byte %d differs after a round trip through scattered blocks", m, i)
			}
		}
	}
	return nil
}

// submission is how runEngine submits both directions.
type submission int

const (
	onboardFirst submission = iota // one goroutine: the onboard, then the offload
	offloadFirst                   // one goroutine: the offload, then the onboard
	concurrent                     // each from a goroutine of its own, at once
)

// runEngine onboards pa with on and offloads pb with off, as dir says, and
// returns the wall time until both are done. Both ways, order says how they
// are submitted. during, where not nil, runs once both are submitted, while
// they are in flight (the overlap measurement's compute kernel). Where
// chose is not nil, it records under name which method moved each
// direction and how long its submission took.
func (b *bench) runEngine(dir direction, on, off *transfer.Engine, pa, pb []transfer.Pair, order submission, chose map[string]string, name string, during func() error) (time.Duration, error) {
	ctx := context.Background()
	start := time.Now()
	var tOn, tOff *transfer.Transfer
	var errOn, errOff error
	var issueOn, issueOff time.Duration // how long each submission took
	submitOn := func() {
		if dir == htod || dir == both {
			s := time.Now()
			tOn, errOn = on.Onboard(ctx, pa)
			issueOn = time.Since(s)
		}
	}
	submitOff := func() {
		if dir == dtoh || dir == both {
			s := time.Now()
			tOff, errOff = off.Offload(ctx, pb, nil)
			issueOff = time.Since(s)
		}
	}
	switch order {
	case offloadFirst:
		submitOff()
		submitOn()
	case concurrent:
		var wg sync.WaitGroup
		wg.Go(submitOff)
		submitOn()
		wg.Wait()
	default:
		submitOn()
		submitOff()
	}
	errs := []error{errOn, errOff}
	if during != nil {
		errs = append(errs, during())
	}
	var picks []string
	for _, tc := range []struct {
		what  string
		t     *transfer.Transfer
		issue time.Duration
	}{{"onboard", tOn, issueOn}, {"offload", tOff, issueOff}} {
		if tc.t == nil {
			continue
		}
		errs = append(errs, tc.t.Wait(ctx))
		picks = append(picks, fmt.Sprintf("%s %s, submitted in %.2f ms", tc.what, methodName(tc.t), tc.issue.Seconds()*1e3))
		tc.t.Release()
	}
	d := time.Since(start)
	if chose != nil {
		chose[name] = strings.Join(picks, ", ")
	}
	return d, errors.Join(errs...)
}

// methodName says which method moved t's descriptors, and how many: the
// gather path's chunks (each one DMA here, the host slots being
// contiguous), or the descriptors the copy kernel moved of all.
func methodName(t *transfer.Transfer) string {
	if c := t.GatherChunks(); c > 0 {
		return fmt.Sprintf("by gather/scatter (%d chunks, %d DMAs)", c, t.Copies())
	}
	how := "by the kernel and batches"
	switch k := t.KernelCopies(); {
	case k == t.Copies():
		how = "by the copy kernel"
	case k == 0:
		how = "by batches"
	}
	return fmt.Sprintf("%s (%d of %d descriptors)", how, t.KernelCopies(), t.Copies())
}

func (b *bench) runLoop(dir direction, pa, pb []transfer.Pair, bs int64) (time.Duration, error) {
	start := time.Now()
	var wg sync.WaitGroup
	var errA, errB error
	if dir == htod || dir == both {
		wg.Go(func() {
			for _, p := range pa {
				off := int64(p.HostSlot) * bs
				if errA = b.sA.CopyHtoD(b.gpu+cudastream.DevicePtr(int64(p.GPUBlock)*bs), b.pool[off:off+bs]); errA != nil {
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
				if errB = b.sB.CopyDtoH(b.pool[off:off+bs], b.gpu+cudastream.DevicePtr(int64(p.GPUBlock)*bs)); errB != nil {
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
// alone and while the engine moves 1 GiB: onboards of 16 KiB and 2 MiB
// blocks by the engine's default, and 1 GiB each way at once in 16 KiB
// blocks by each method (the copy kernel takes SMs for the whole transfer,
// batches none, gather/scatter a few for a short part of each chunk). Two
// shapes of compute: one wave of 4 CTAs per SM (every SM's share fixed up
// front, as in a persistent kernel) and 32 CTAs per SM (waves, as a large
// GEMM or attention kernel runs). Each is sized to take about half the
// onboard, so that it runs entirely inside it.
func (b *bench) overlap(res *results.File, rounds, fmaIters int, base transfer.Config) error {
	k, err := b.newFMATimer()
	if err != nil {
		return err
	}
	defer k.close()
	cases := overlapCases(base)
	for _, shape := range []fmaShape{
		{"1 wave, 4 CTAs/SM", 4, fmaIters},
		{"waves, 32 CTAs/SM", 32, fmaIters / 8},
	} {
		aloneName := fmt.Sprintf("compute (FMA, %s) alone", shape.name)
		for ci, c := range cases {
			o, err := b.timeOverlap(k, c, shape, rounds, base)
			if err != nil {
				return err
			}
			if ci == 0 {
				res.Add(aloneName, "ms", o.alone, "")
			}
			res.Add(fmt.Sprintf("compute (FMA, %s) during %s", shape.name, c.what), "ms", o.shared, aloneName)
			res.Add(fmt.Sprintf("%s, during compute (FMA, %s)", c.what, shape.name), "GiB/s", o.moved, "")
			if shape.ctasPerSM == 4 {
				res.Notes = append(res.Notes, fmt.Sprintf("overlap: %s moved %s", c.what, o.chose))
			}
		}
	}
	return nil
}

// fmaShape is a launch of the FMA kernel: CTAs per SM and iterations per
// thread.
type fmaShape struct {
	name             string
	ctasPerSM, iters int
}

// overlapCase is the copies the kernel runs during: what they are, their
// block size, the engine's method and their direction.
type overlapCase struct {
	what   string
	bs     int64
	method engineMethod
	dir    direction
}

// overlapCases are onboards of 16 KiB and 2 MiB blocks by engine-auto,
// then both ways at once in 16 KiB blocks by each method.
func overlapCases(base transfer.Config) []overlapCase {
	auto := methods(base)[0]
	cases := []overlapCase{
		{"a 1 GiB onboard of 16KiB blocks, engine-auto", 16 << 10, auto, htod},
		{"a 1 GiB onboard of 2MiB blocks, engine-auto", 2 << 20, auto, htod},
	}
	for _, m := range methods(base) {
		cases = append(cases, overlapCase{"1 GiB each way at once in 16KiB blocks, " + m.name, 16 << 10, m, both})
	}
	return cases
}

// overlapSamples are one case's samples: the kernel's ms alone and during
// the copies, the copies' GiB/s, and how the engine moved them.
type overlapSamples struct {
	alone, shared, moved []float64
	chose                string
}

// timeOverlap times the kernel in shape alone and during c's copies, in
// turn (which goes first alternating by round), after one warm-up round.
func (b *bench) timeOverlap(k *fmaTimer, c overlapCase, shape fmaShape, rounds int, base transfer.Config) (overlapSamples, error) {
	var o overlapSamples
	e, err := b.methodEngine(c.bs, base, c.method)
	if err != nil {
		return o, err
	}
	defer e.Close()
	pa, pb := b.halfPairs(0, c.bs, 99), b.halfPairs(1, c.bs, 98)
	chose := map[string]string{}
	for r := -1; r < rounds; r++ {
		for i := 0; i < 2; i++ {
			withCopies := (i+max(r, 0))%2 == 1
			var d, copyTime time.Duration
			if withCopies {
				copyTime, err = b.runEngine(c.dir, e, e, pa, pb, onboardFirst, chose, "overlap", func() (kerr error) {
					d, kerr = k.time(shape)
					return kerr
				})
			} else {
				d, err = k.time(shape)
			}
			if err != nil {
				return o, err
			}
			if r < 0 {
				continue
			}
			if !withCopies {
				o.alone = append(o.alone, d.Seconds()*1e3)
				continue
			}
			o.shared = append(o.shared, d.Seconds()*1e3)
			bytes := float64(b.total)
			if c.dir == both {
				bytes *= 2
			}
			o.moved = append(o.moved, bytes/copyTime.Seconds()/(1<<30))
		}
	}
	o.chose = chose["overlap"]
	return o, nil
}

// fmaTimer launches the FMA kernel on a compute stream of its own and
// times it with a pair of events.
type fmaTimer struct {
	compute cudastream.Stream
	cl      cudastream.ComputeLoader
	t0, t1  cudastream.Event
}

// newFMATimer makes the compute stream and the events. The caller MUST
// close it.
func (b *bench) newFMATimer() (*fmaTimer, error) {
	compute, err := b.dev.NewStream(0)
	if err != nil {
		return nil, err
	}
	k := &fmaTimer{compute: compute}
	var ok bool
	if k.cl, ok = compute.(cudastream.ComputeLoader); !ok {
		compute.Destroy()
		return nil, fmt.Errorf("the device's streams (%T) cannot launch the FMA kernel", compute)
	}
	if k.t0, err = b.dev.NewEvent(cudastream.EventOptions{Timing: true}); err != nil {
		compute.Destroy()
		return nil, err
	}
	if k.t1, err = b.dev.NewEvent(cudastream.EventOptions{Timing: true}); err != nil {
		k.t0.Destroy()
		compute.Destroy()
		return nil, err
	}
	return k, nil
}

// close destroys the events and the stream.
func (k *fmaTimer) close() {
	k.t1.Destroy()
	k.t0.Destroy()
	k.compute.Destroy()
}

// time launches the kernel in shape and waits for it; it returns the
// kernel's time between its events.
func (k *fmaTimer) time(shape fmaShape) (time.Duration, error) {
	if err := k.t0.Record(k.compute); err != nil {
		return 0, err
	}
	if err := k.cl.LaunchFMA(shape.ctasPerSM, shape.iters); err != nil {
		return 0, err
	}
	if err := k.t1.Record(k.compute); err != nil {
		return 0, err
	}
	if err := k.t1.Synchronize(); err != nil {
		return 0, err
	}
	return k.t1.Elapsed(k.t0)
}
