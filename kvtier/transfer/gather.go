package transfer

import (
	"context"
	"errors"
	"fmt"

	"kvtier.dev/cudastream"
)

// The gather/scatter path (MethodGather). Small blocks scattered on the GPU
// cost the copy engines one descriptor each, and the copy kernel's PCIe
// traffic tops out near 55 GiB/s for both directions together. This path
// moves them in three steps instead, each on the hardware that does it best:
//
//	offload: copy kernel gathers blocks -> device staging buffer -> one DMA per host run
//	onboard: one DMA per host run -> device staging buffer -> copy kernel scatters blocks
//
// The device-to-device step runs at HBM speed on a few SMs for a small share
// of the transfer's time, and the link sees a few large DMAs (16 MiB chunks
// by default), which both directions can run at once at the link's duplex
// rate. Each direction has a ring of device staging buffers and a second
// stream for its kernel, so that the kernel of chunk k+1 runs while chunk k
// crosses the link. The two streams meet only on the device: a chunk's DMA
// waits for the event of the kernel that filled its buffer (or the kernel
// for the DMA's), and a buffer is refilled only after the event of the step
// that last read it (invariant 3 for device memory). Nothing waits on the
// host.
//
// Per-layer readiness holds: an onboard still goes layer by layer, and the
// event of layer l is recorded on the kernel stream after the scatter of the
// chunk that holds layer l's last piece. A chunk may hold the end of one
// layer and the start of the next, so a layer is ready at most one chunk
// later than its own bytes.

// Defaults of the device staging ring (Config.GatherBufferBytes and
// Config.GatherBuffers), from the H200 (2026-12-02, 1 GiB each way, blocks
// of 16 KiB to 2 MiB scattered over 4 GiB): 16 MiB chunks in a ring of 3
// reached 91-93 GiB/s both ways at every block size, where 4 MiB chunks
// reached 85-90 and 64 MiB ones 84-91; 2 buffers instead of 3 lost up to 6%.
const (
	DefaultGatherBufferBytes = 16 << 20
	DefaultGatherBuffers     = 3
)

// gatherRing is one direction's device staging ring. It belongs to its
// direction and is used only under the direction's lock.
type gatherRing struct {
	kernel cudastream.Stream // runs the gather (offload) or scatter (onboard) kernels
	kc     cudastream.KernelCopier
	bufs   []gatherBuf
	next   int   // the buffer the chunk being built goes to
	size   int64 // bytes per buffer
	fill   int64 // bytes of the chunk being built
	// join is recorded on one of the direction's streams and waited on by
	// the other, so that a failed transfer's last event follows everything
	// it issued on both.
	join cudastream.Event

	dma, dev coalescer // the chunk's link copies and its device-side copies
}

type gatherBuf struct {
	base   uint64
	filled cudastream.Event // recorded after the step that wrote the buffer
	freed  cudastream.Event // recorded after the step that read it
	used   bool             // freed has been recorded at least once
}

// gatherLaunches is how many gather or scatter launches the kernel stream
// queues before a submission waits on the host: each waits on the device
// for its chunk's DMA, so the stream's descriptor ring must hold as many as
// the transfers in flight have chunks (128 chunks of 16 MiB: 2 GiB).
const gatherLaunches = 128

// newGatherRing allocates n buffers of size bytes and their events, and
// the kernel stream, at priority prio, for pieces of partBytes. It returns
// nil with no error when the device's streams have no copy kernel.
func newGatherRing(dev cudastream.Device, n int, size, partBytes int64, prio int, ko cudastream.KernelCopyOptions) (*gatherRing, cudastream.DevicePtr, error) {
	s, err := dev.NewStream(prio)
	if err != nil {
		return nil, 0, fmt.Errorf("transfer: gather stream: %w", err)
	}
	kc, ok := s.(cudastream.KernelCopier)
	if !ok {
		s.Destroy()
		return nil, 0, nil
	}
	r := &gatherRing{kernel: s, kc: kc, size: size}
	fail := func(err error) (*gatherRing, cudastream.DevicePtr, error) {
		r.destroy(dev, 0)
		return nil, 0, err
	}
	// One chunk's pieces in one slot of the descriptor ring: the kernel
	// cuts copies to PieceBytes, and a chunk holds size/partBytes pieces
	// at most, plus a cut per copy.
	if ko.Launches == 0 {
		ko.Launches = gatherLaunches
	}
	if ko.PiecesPerLaunch == 0 {
		piece := ko.PieceBytes
		if piece == 0 {
			piece = cudastream.DefaultKernelPieceBytes
		}
		ko.PiecesPerLaunch = int(min(max(2*size/min(partBytes, piece), 64), 1<<16))
	}
	if err := kc.SetKernelCopyOptions(ko); err != nil {
		return fail(fmt.Errorf("transfer: Config.KernelCopy: %w", err))
	}
	mem, err := dev.Alloc(int64(n) * size)
	if err != nil {
		return fail(fmt.Errorf("transfer: %d device staging buffers of %d bytes (Config.GatherBuffers, Config.GatherBufferBytes): %w", n, size, err))
	}
	if r.join, err = dev.NewEvent(cudastream.EventOptions{}); err != nil {
		dev.Free(mem)
		return fail(fmt.Errorf("transfer: gather event: %w", err))
	}
	for i := range n {
		b := gatherBuf{base: uint64(mem) + uint64(int64(i)*size)}
		r.bufs = append(r.bufs, b)
		if b.filled, err = dev.NewEvent(cudastream.EventOptions{}); err == nil {
			b.freed, err = dev.NewEvent(cudastream.EventOptions{})
			if err != nil {
				b.filled.Destroy()
			}
		}
		if err != nil {
			r.bufs = r.bufs[:i]
			r.destroy(dev, mem)
			return nil, 0, fmt.Errorf("transfer: gather event: %w", err)
		}
		r.bufs[i] = b
	}
	// The copy kernel may still be unusable (its module does not load on
	// this device): try it once, on the ring's own memory.
	probe := []cudastream.Copy{{Dst: uint64(mem) + 16, Src: uint64(mem), Bytes: 16}}
	if err := kc.CopyKernel(cudastream.DeviceToDevice, probe); err != nil {
		r.destroy(dev, mem)
		return nil, 0, fmt.Errorf("%w: the gather kernel: %w", errNoGatherKernel, err)
	}
	if err := s.Synchronize(); err != nil {
		r.destroy(dev, mem)
		return nil, 0, fmt.Errorf("%w: the gather kernel: %w", errNoGatherKernel, err)
	}
	return r, mem, nil
}

// destroy releases the ring's stream, events and memory (mem, where not 0),
// after the stream's work completes.
func (r *gatherRing) destroy(dev cudastream.Device, mem cudastream.DevicePtr) error {
	var errs []error
	if r.kernel != nil {
		errs = append(errs, r.kernel.Destroy())
	}
	for _, b := range r.bufs {
		if b.filled != nil {
			errs = append(errs, b.filled.Destroy(), b.freed.Destroy())
		}
	}
	if r.join != nil {
		errs = append(errs, r.join.Destroy())
	}
	if mem != 0 {
		errs = append(errs, dev.Free(mem))
	}
	return errors.Join(errs...)
}

// joinStreams makes later work on to wait for everything enqueued on from.
func (r *gatherRing) joinStreams(from, to cudastream.Stream) error {
	if err := r.join.Record(from); err != nil {
		return err
	}
	return to.WaitEvent(r.join)
}

// gatherPlan is what decides whether a transfer takes the gather path: the
// bytes it moves, the contiguous pieces on the GPU side and the runs on the
// host side (the link's descriptors if it gathers).
type gatherPlan struct {
	bytes             int64
	devRuns, hostRuns int
}

// planGather counts a transfer's contiguous runs on each side without
// building any descriptor: whole blocks (offloads) or layer by layer
// (onboards). A side's run continues while the next piece starts where the
// last ended, and a host run also ends at a registration boundary.
func (e *Engine) planGather(pairs []Pair, wholeBlocks bool) gatherPlan {
	g, h := &e.gpu, &e.host
	var p gatherPlan
	var devEnd, hostEnd uint64
	piece := func(dev, host uint64, n int64, split bool) {
		if dev != devEnd {
			p.devRuns++
		}
		if host != hostEnd || split {
			p.hostRuns++
		}
		devEnd, hostEnd = dev+uint64(n), host+uint64(n)
		p.bytes += n
	}
	slotAddr := func(pr Pair, layer, part int) uint64 {
		return e.hostBase + uint64(int64(pr.HostSlot)*h.SlotBytes) + uint64(int64(layer*g.Parts+part)*g.PartBytes)
	}
	if wholeBlocks {
		for _, pr := range pairs {
			split := h.startsRegistration(pr.HostSlot)
			for layer := range g.Layers {
				for part := range g.Parts {
					piece(g.addr(pr.GPUBlock, layer, part), slotAddr(pr, layer, part), g.PartBytes, split)
					split = false
				}
			}
		}
		return p
	}
	for layer := range g.Layers {
		for _, pr := range pairs {
			split := h.startsRegistration(pr.HostSlot)
			for part := range g.Parts {
				piece(g.addr(pr.GPUBlock, layer, part), slotAddr(pr, layer, part), g.PartBytes, split)
				split = false
			}
		}
	}
	return p
}

// gatherOffload issues t's blocks through d's ring: for each chunk, the
// gather kernel (after the producer's events, which the caller has made
// the kernel stream wait on) and then the chunk's DMAs on d's stream. t's
// final event, recorded by submit on d's stream, follows every step.
func (e *Engine) gatherOffload(ctx context.Context, d *direction, t *Transfer, pairs []Pair) {
	r := d.ring
	r.start()
	t.gathered = true
	e.stats.gatherTransfers.Add(1)
	g, h := &e.gpu, &e.host
	for i, p := range pairs {
		split := h.startsRegistration(p.HostSlot)
		for layer := 0; layer < g.Layers && t.err == nil; layer++ {
			for part := range g.Parts {
				if r.fill+g.PartBytes > r.size {
					if e.flushOffloadChunk(ctx, d, t); t.err != nil {
						break
					}
				}
				stage := r.bufs[r.next].base + uint64(r.fill)
				host := e.hostBase + uint64(int64(p.HostSlot)*h.SlotBytes) + uint64(int64(layer*g.Parts+part)*g.PartBytes)
				r.dev.add(stage, g.addr(p.GPUBlock, layer, part), g.PartBytes, i, false)
				r.dma.add(host, stage, g.PartBytes, i, split)
				r.fill += g.PartBytes
				split = false
			}
		}
		if t.err != nil {
			break
		}
	}
	if t.err == nil {
		e.flushOffloadChunk(ctx, d, t)
	}
	if t.err != nil {
		// Whatever the kernel stream still runs must finish before the
		// final event that submit records on d's stream.
		if err := r.joinStreams(r.kernel, d.stream); err != nil {
			t.err = errors.Join(t.err, err)
		}
	}
}

// flushOffloadChunk issues the chunk built so far: the gather into its
// buffer once the buffer's last DMA has read it, then the DMAs to the host.
func (e *Engine) flushOffloadChunk(ctx context.Context, d *direction, t *Transfer) {
	r := d.ring
	if len(r.dma.ops) == 0 {
		return
	}
	if err := ctx.Err(); err != nil {
		t.err = err
		return
	}
	k := r.next
	b := &r.bufs[k]
	step := func(what string, err error) bool {
		if err != nil {
			t.err = fmt.Errorf("transfer: offload (gather), chunk %d (staging buffer %d, from pair %d): %s: %w", t.gatherChunks, k, r.dma.origin[0], what, err)
		}
		return err == nil
	}
	if b.used && !e.skipGatherWait {
		if !step("wait for the buffer's last DMA", r.kernel.WaitEvent(b.freed)) {
			return
		}
	}
	if !step("gather kernel", e.kernelCopies(r, r.dev.ops)) ||
		!step("record the gather's event", b.filled.Record(r.kernel)) ||
		!step("wait for the gather", d.stream.WaitEvent(b.filled)) ||
		!step("DMA to the host", e.batches(d, r.dma.ops)) ||
		!step("record the DMA's event", b.freed.Record(d.stream)) {
		return
	}
	e.chunkIssued(r, t)
}

// scatterOnboard issues t's blocks through d's ring, layer by layer: for
// each chunk, its DMAs on d's stream and then the scatter kernel, and after
// the chunk that completes a layer, that layer's event on the kernel
// stream. It records every layer event itself, on the kernel stream, also
// after an error (after joining d's stream), so that t is done only once
// nothing it issued still runs.
func (e *Engine) scatterOnboard(ctx context.Context, d *direction, t *Transfer, pairs []Pair) {
	r := d.ring
	r.start()
	t.gathered = true
	e.stats.gatherTransfers.Add(1)
	g, h := &e.gpu, &e.host
	recorded := 0 // layer events recorded so far
	on := r.kernel
	if e.earlyLayerEvents {
		on = d.stream
	}
	record := func(upTo int) {
		for ; recorded < upTo; recorded++ {
			if err := t.layerEv[recorded].Record(on); err != nil && t.err == nil {
				t.err = fmt.Errorf("transfer: onboard (scatter) layer %d: record event: %w", recorded, err)
			}
		}
	}
	for layer := 0; layer < g.Layers && t.err == nil; layer++ {
		for i, p := range pairs {
			split := h.startsRegistration(p.HostSlot)
			for part := 0; part < g.Parts && t.err == nil; part++ {
				if r.fill+g.PartBytes > r.size {
					if e.flushOnboardChunk(ctx, d, t); t.err == nil {
						record(layer) // layers before this one are all in flushed chunks
					}
					if t.err != nil {
						break
					}
				}
				stage := r.bufs[r.next].base + uint64(r.fill)
				host := e.hostBase + uint64(int64(p.HostSlot)*h.SlotBytes) + uint64(int64(layer*g.Parts+part)*g.PartBytes)
				r.dma.add(stage, host, g.PartBytes, i, split)
				r.dev.add(g.addr(p.GPUBlock, layer, part), stage, g.PartBytes, i, false)
				r.fill += g.PartBytes
				split = false
			}
			if t.err != nil {
				break
			}
		}
	}
	if t.err == nil {
		e.flushOnboardChunk(ctx, d, t)
	}
	if t.err != nil {
		if err := r.joinStreams(d.stream, r.kernel); err != nil {
			t.err = errors.Join(t.err, err)
		}
	}
	record(g.Layers)
}

// flushOnboardChunk issues the chunk built so far: the DMAs into its
// buffer once the buffer's last scatter has read it, then the scatter.
func (e *Engine) flushOnboardChunk(ctx context.Context, d *direction, t *Transfer) {
	r := d.ring
	if len(r.dma.ops) == 0 {
		return
	}
	if err := ctx.Err(); err != nil {
		t.err = err
		return
	}
	k := r.next
	b := &r.bufs[k]
	step := func(what string, err error) bool {
		if err != nil {
			t.err = fmt.Errorf("transfer: onboard (scatter), chunk %d (staging buffer %d, from pair %d): %s: %w", t.gatherChunks, k, r.dma.origin[0], what, err)
		}
		return err == nil
	}
	if b.used && !e.skipGatherWait {
		if !step("wait for the buffer's last scatter", d.stream.WaitEvent(b.freed)) {
			return
		}
	}
	if !step("DMA to the device", e.batches(d, r.dma.ops)) ||
		!step("record the DMA's event", b.filled.Record(d.stream)) ||
		!step("wait for the DMA", r.kernel.WaitEvent(b.filled)) ||
		!step("scatter kernel", e.kernelCopies(r, r.dev.ops)) ||
		!step("record the scatter's event", b.freed.Record(r.kernel)) {
		return
	}
	e.chunkIssued(r, t)
}

// start readies the ring for a transfer's chunks.
func (r *gatherRing) start() {
	r.dma.reset()
	r.dev.reset()
	r.fill = 0
}

// chunkIssued counts the chunk just issued in t and moves the ring on.
func (e *Engine) chunkIssued(r *gatherRing, t *Transfer) {
	for _, op := range r.dma.ops {
		t.bytes += op.Bytes
	}
	t.copies += len(r.dma.ops)
	t.gatherChunks++
	e.stats.descriptors.Add(int64(len(r.dma.ops)))
	e.stats.gatherChunks.Add(1)
	e.stats.gatherKernelDescriptors.Add(int64(len(r.dev.ops)))
	r.bufs[r.next].used = true
	r.next = (r.next + 1) % len(r.bufs)
	r.start()
}

// kernelCopies runs device-to-device ops on the ring's kernel stream, at
// most MaxBatch descriptors per call.
func (e *Engine) kernelCopies(r *gatherRing, ops []cudastream.Copy) error {
	for len(ops) > 0 {
		n := min(len(ops), e.maxBatch)
		if err := r.kc.CopyKernel(cudastream.DeviceToDevice, ops[:n]); err != nil {
			return err
		}
		ops = ops[n:]
	}
	return nil
}

// batches submits a chunk's link copies on d's stream, at most MaxBatch
// descriptors per call.
func (e *Engine) batches(d *direction, ops []cudastream.Copy) error {
	for len(ops) > 0 {
		n := min(len(ops), e.maxBatch)
		if err := d.stream.CopyBatch(d.kind, ops[:n]); err != nil {
			return err
		}
		ops = ops[n:]
	}
	return nil
}

// errNoGatherKernel: the ring's copy kernel failed its first copy.
var errNoGatherKernel = errors.New("transfer: the device cannot run the gather/scatter path")

// DefaultGatherMinRunBytes is Config.GatherMinRunBytes's default: host runs
// of 1 MiB and more keep the link's DMAs near its large-copy rate.
const DefaultGatherMinRunBytes = 1 << 20

// checkGatherConfig checks the ring's settings and fills their defaults.
func checkGatherConfig(cfg *Config) error {
	switch {
	case cfg.GatherBuffers < 0 || cfg.GatherBuffers > 64:
		return fmt.Errorf("transfer: Config.GatherBuffers must be in [0, 64] (0: no gather/scatter path), got %d", cfg.GatherBuffers)
	case cfg.GatherBufferBytes < 0:
		return fmt.Errorf("transfer: Config.GatherBufferBytes must not be negative, got %d", cfg.GatherBufferBytes)
	case cfg.GatherMinRunBytes < 0:
		return fmt.Errorf("transfer: Config.GatherMinRunBytes must not be negative, got %d", cfg.GatherMinRunBytes)
	case cfg.Method == MethodGather && cfg.GatherBuffers == 0:
		return errors.New("transfer: Config.Method is gather, but Config.GatherBuffers is 0: the path needs a device staging ring")
	}
	if cfg.GatherBufferBytes == 0 {
		cfg.GatherBufferBytes = DefaultGatherBufferBytes
	}
	if cfg.GatherMinRunBytes == 0 {
		cfg.GatherMinRunBytes = DefaultGatherMinRunBytes
	}
	if cfg.GatherBuffers > 0 && cfg.GatherBufferBytes < cfg.GPU.PartBytes {
		return fmt.Errorf("transfer: Config.GatherBufferBytes %d cannot hold one piece of %d bytes (GPU.PartBytes)", cfg.GatherBufferBytes, cfg.GPU.PartBytes)
	}
	return nil
}

// setupGather builds each direction's ring. Called by New once the streams
// exist; on error, Close releases what was built.
func (e *Engine) setupGather(cfg *Config) error {
	if cfg.GatherBuffers == 0 {
		return nil
	}
	prio := [2]int{cfg.OnboardPriority, cfg.OffloadPriority}
	for i, d := range []*direction{&e.on, &e.off} {
		r, mem, err := newGatherRing(e.dev, cfg.GatherBuffers, cfg.GatherBufferBytes, cfg.GPU.PartBytes, prio[i], cfg.KernelCopy)
		if errors.Is(err, errNoGatherKernel) && cfg.Method == MethodAuto {
			return nil // Auto copies directly
		}
		if err != nil {
			return err
		}
		if r == nil {
			if cfg.Method == MethodGather {
				return fmt.Errorf("transfer: Config.Method is gather, but the device's streams (%T) have no copy kernel", d.stream)
			}
			return nil
		}
		d.ring = r
		e.gatherMem = append(e.gatherMem, mem)
		r.dma.limit, r.dev.limit = cfg.MaxBatch, cfg.MaxBatch
	}
	return nil
}

// GatherBytes is the device memory the engine's staging rings take (0
// without the gather/scatter path).
func (e *Engine) GatherBytes() int64 {
	var n int64
	for _, d := range []*direction{&e.on, &e.off} {
		if d.ring != nil {
			n += int64(len(d.ring.bufs)) * d.ring.size
		}
	}
	return n
}

// useGather reports whether a transfer of pairs on d takes the gather path
// (whole blocks for offloads, layer by layer for onboards).
// MethodAuto gathers where the host side coalesces into runs of at least
// GatherMinRunBytes on average and at least four times the GPU side's
// pieces: then a chunk's DMAs are few and long, where direct copies would be
// one descriptor (or kernel piece) per GPU piece.
func (e *Engine) useGather(d *direction, pairs []Pair, wholeBlocks bool) bool {
	if d.ring == nil || len(pairs) == 0 {
		return false
	}
	use := e.method == MethodGather
	if e.method == MethodAuto {
		p := e.planGather(pairs, wholeBlocks)
		host := p.bytes / int64(p.hostRuns)
		dev := p.bytes / int64(p.devRuns)
		use = host >= e.gatherMinRun && host >= 4*dev
	}
	return use
}
