package transfer

import (
	"context"
	"errors"
	"fmt"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/codec"
)

// The gather/scatter path (MethodGather) moves small blocks scattered on
// the GPU in three steps, each on the hardware that does it best:
//
//	offload: copy kernel gathers blocks -> device staging buffer -> one DMA per host run
//	onboard: one DMA per host run -> device staging buffer -> copy kernel scatters blocks
//
// Each direction has a ring of device staging buffers and a second stream
// for its kernel. The two streams meet only on the device: a chunk's DMA
// waits for the event of the kernel that filled its buffer (or the kernel
// for the DMA's), and a buffer is refilled only after the event of the step
// that last read it (invariant 3 for device memory). Nothing waits on the
// host. An onboard's layer l is ready, on the kernel stream, after the
// scatter of the chunk that holds its last piece: at most one chunk later
// than its own bytes. Why, and what it measured: docs/transfer.md.

// Defaults of the device staging ring (Config.GatherBufferBytes and
// Config.GatherBuffers): on the H200, 16 MiB chunks in a ring of 3
// reached 91-93 GiB/s both ways at every block size (docs/transfer.md
// compares other sizes and depths).
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
	mem    cudastream.DevicePtr // the buffers' device memory (0: not allocated)
	next   int                  // the buffer the chunk being built goes to
	size   int64                // bytes per buffer
	fill   int64                // bytes of the chunk being built
	// join is recorded on one of the direction's streams and waited on by
	// the other, so that a failed transfer's last event follows everything
	// it issued on both.
	join cudastream.Event

	link linkOps   // the chunk's copies over the link
	dev  coalescer // the chunk's device-side copies (gather or scatter)
	plan linkOps   // planGather's scratch
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
func newGatherRing(dev cudastream.Device, n int, size, partBytes int64, prio int, ko cudastream.KernelCopyOptions) (*gatherRing, error) {
	s, err := dev.NewStream(prio)
	if err != nil {
		return nil, fmt.Errorf("transfer: gather stream: %w", err)
	}
	kc, ok := s.(cudastream.KernelCopier)
	if !ok {
		s.Destroy()
		return nil, nil
	}
	r := &gatherRing{kernel: s, kc: kc, size: size}
	fail := func(err error) (*gatherRing, error) {
		r.destroy(dev)
		return nil, err
	}
	// One chunk's pieces in one slot of the descriptor ring: the kernel
	// cuts copies to PieceBytes, and a chunk holds size/partBytes pieces
	// at most, plus a cut per copy.
	if ko.Launches == 0 {
		ko.Launches = gatherLaunches
	}
	// A launch's descriptors are read over the link: a device copy of them
	// would queue behind the chunks' DMAs on the host-to-device engine
	// (the H200 at 9efa8b5: onboards through the ring at 41-43 GiB/s one
	// way, 62-75 both ways).
	ko.MappedDescriptors = true
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
	if r.mem, err = dev.Alloc(int64(n) * size); err != nil {
		return fail(fmt.Errorf("transfer: %d device staging buffers of %d bytes (Config.GatherBuffers, Config.GatherBufferBytes): %w", n, size, err))
	}
	if r.join, err = dev.NewEvent(cudastream.EventOptions{}); err != nil {
		return fail(fmt.Errorf("transfer: gather event: %w", err))
	}
	for i := range n {
		b := gatherBuf{base: uint64(r.mem) + uint64(int64(i)*size)}
		if b.filled, err = dev.NewEvent(cudastream.EventOptions{}); err != nil {
			return fail(fmt.Errorf("transfer: gather event: %w", err))
		}
		if b.freed, err = dev.NewEvent(cudastream.EventOptions{}); err != nil {
			b.filled.Destroy()
			return fail(fmt.Errorf("transfer: gather event: %w", err))
		}
		r.bufs = append(r.bufs, b)
	}
	// The copy kernel may still be unusable (its module does not load on
	// this device): try it once, on the ring's own memory.
	probe := []cudastream.Copy{{Dst: uint64(r.mem) + 16, Src: uint64(r.mem), Bytes: 16}}
	if err := kc.CopyKernel(cudastream.DeviceToDevice, probe); err != nil {
		return fail(fmt.Errorf("%w: the gather kernel: %w", errNoGatherKernel, err))
	}
	if err := s.Synchronize(); err != nil {
		return fail(fmt.Errorf("%w: the gather kernel: %w", errNoGatherKernel, err))
	}
	return r, nil
}

// destroy releases the ring's stream, events and memory, after the
// stream's work completes.
func (r *gatherRing) destroy(dev cudastream.Device) error {
	return destroyRing(dev, r.kernel, r.join, r.mem, len(r.bufs), func(i int) (cudastream.Event, cudastream.Event) {
		return r.bufs[i].filled, r.bufs[i].freed
	})
}

// joinAfterError joins a failed transfer's two streams (a ring's kernel
// stream and its direction's), so that what one still runs ends before the
// transfer's last event on the other: the link's stream waits for the
// kernels after an offload, the kernel stream for the link after an
// onboard.
func joinAfterError(t *Transfer, join func(from, to cudastream.Stream) error, kernel, link cudastream.Stream, offload bool) {
	from, to := kernel, link
	if !offload {
		from, to = link, kernel
	}
	if err := join(from, to); err != nil {
		t.err = errors.Join(t.err, err)
	}
}

// passChunk runs one chunk through a staging buffer: fill writes it on
// fillOn, read reads it on readOn, ordered on the device by the buffer's
// events; with wait, the fill first waits for the buffer's last reader
// (invariant 3). step reports each call's error; passChunk returns false
// at the first.
func passChunk(step func(doing string, err error) bool, wait bool, filled, freed cudastream.Event,
	fillOn, readOn cudastream.Stream, fill, read func() error) bool {
	if wait && !step("wait for the buffer's last reader", fillOn.WaitEvent(freed)) {
		return false
	}
	return step("fill the buffer", fill()) &&
		step("record the fill's event", filled.Record(fillOn)) &&
		step("wait for the fill", readOn.WaitEvent(filled)) &&
		step("read the buffer", read()) &&
		step("record the read's event", freed.Record(readOn))
}

// destroyRing releases a staging ring: its kernel stream, then its n
// buffers' events (bufEvents(i): filled and freed), its join event and its
// device memory, each if set.
func destroyRing(dev cudastream.Device, kernel cudastream.Stream, join cudastream.Event, mem cudastream.DevicePtr,
	n int, bufEvents func(i int) (filled, freed cudastream.Event)) error {
	var errs []error
	if kernel != nil {
		errs = append(errs, kernel.Destroy())
	}
	for i := range n {
		filled, freed := bufEvents(i)
		errs = append(errs, filled.Destroy(), freed.Destroy())
	}
	if join != nil {
		errs = append(errs, join.Destroy())
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

// linkOps builds a chunk's copies over the link, one per host run. A
// chunk's staging side is dense (its rows follow one another), so runs are
// decided on the host side: a row that continues the last one makes it
// longer, and, where the stream has strided copies, a row of the same width
// one slot after the last makes one more row of a strided copy (Copy2D).
// So the pieces of one layer in consecutive host slots, strided by the
// slot, cross the link as one DMA descriptor.
type linkOps struct {
	ops    []cudastream.Copy2D
	origin []int32 // the pair that opened each op, to name it in an error
	// offload: the host is the destination (Dst), else the source.
	offload bool
	// slot is the host stride a strided copy may take (the slot size); 0
	// when the stream has no strided copies.
	slot int64
	flat []cudastream.Copy // the one-row ops of a chunk, as one batch
}

func (l *linkOps) reset() {
	l.ops = l.ops[:0]
	l.origin = l.origin[:0]
}

// add appends a row of n bytes between the chunk's staging address stage
// and the host address host. split forbids merging it with the last op:
// it starts a new host registration, and a copy may not span two.
func (l *linkOps) add(stage, host uint64, n int64, pair int, split bool) {
	if k := len(l.ops) - 1; k >= 0 && !split {
		o := &l.ops[k]
		oStage, oHost, hostPitch := o.Src, o.Dst, o.DstPitch
		if !l.offload {
			oStage, oHost, hostPitch = o.Dst, o.Src, o.SrcPitch
		}
		if stage == oStage+uint64(o.Height*o.Width) {
			switch {
			case o.Height == 1 && host == oHost+uint64(o.Width):
				o.Width += n
				o.DstPitch, o.SrcPitch = o.Width, o.Width
				return
			case l.slot > 0 && o.Width == n && o.Height == 1 && host == oHost+uint64(l.slot):
				o.Height = 2
				l.setHostPitch(o, l.slot)
				return
			case l.slot > 0 && o.Width == n && o.Height > 1 && host == oHost+uint64(o.Height*hostPitch):
				o.Height++
				return
			}
		}
	}
	op := cudastream.Copy2D{Dst: stage, Src: host, DstPitch: n, SrcPitch: n, Width: n, Height: 1}
	if l.offload {
		op.Dst, op.Src = host, stage
	}
	l.ops = append(l.ops, op)
	l.origin = append(l.origin, int32(pair))
}

// setHostPitch gives o's host side the pitch p; the staging side stays dense.
func (l *linkOps) setHostPitch(o *cudastream.Copy2D, p int64) {
	if l.offload {
		o.DstPitch, o.SrcPitch = p, o.Width
	} else {
		o.DstPitch, o.SrcPitch = o.Width, p
	}
}

// bytes is what the ops move.
func (l *linkOps) bytes() int64 {
	var n int64
	for _, o := range l.ops {
		n += o.Width * o.Height
	}
	return n
}

// rows calls fn for each row of a transfer, in the order the gather path
// moves them: a row is one pair's host-contiguous piece, a whole block for
// offloads (layer after layer), one layer's parts for onboards (layer by
// layer, then pair by pair). fn gets the pair's index, the row's host
// address and length, and the row's first layer (-1 for a whole block);
// it returns false to stop.
func (e *Engine) rows(pairs []Pair, wholeBlocks bool, fn func(i int, host uint64, n int64, layer int) bool) {
	g, h := &e.gpu, &e.host
	slot := func(p Pair, layer int) uint64 {
		return e.hostBase + uint64(int64(p.HostSlot)*h.SlotBytes) + uint64(int64(layer*g.Parts)*g.PartBytes)
	}
	if wholeBlocks {
		for i, p := range pairs {
			if !fn(i, slot(p, 0), g.BlockBytes(), -1) {
				return
			}
		}
		return
	}
	for layer := range g.Layers {
		for i, p := range pairs {
			if !fn(i, slot(p, layer), int64(g.Parts)*g.PartBytes, layer) {
				return
			}
		}
	}
}

// rowPiece is the GPU address of piece k (of PartBytes) of pair p's row
// that starts at layer (-1: the whole block, layer after layer).
func (e *Engine) rowPiece(p Pair, layer, k int) uint64 {
	g := &e.gpu
	if layer < 0 {
		return g.addr(p.GPUBlock, k/g.Parts, k%g.Parts)
	}
	return g.addr(p.GPUBlock, layer, k)
}

// gatherPlan is what decides whether a transfer takes the gather path: the
// bytes it moves, the contiguous runs on the GPU side, and the link's
// descriptors if it gathers.
type gatherPlan struct {
	bytes            int64
	devRuns, hostOps int
}

// planGather counts, without issuing anything, the runs of a transfer on
// each side: the GPU side's contiguous pieces, and the link's copies as
// linkOps would build them for one chunk holding it all.
func (e *Engine) planGather(d *direction, pairs []Pair, wholeBlocks bool) gatherPlan {
	l := &d.ring.plan
	l.reset()
	var p gatherPlan
	var devEnd, stage uint64
	e.rows(pairs, wholeBlocks, func(i int, host uint64, n int64, layer int) bool {
		l.add(stage, host, n, i, e.host.startsRegistration(pairs[i].HostSlot))
		stage += uint64(n)
		for k := range int(n / e.gpu.PartBytes) {
			if dev := e.rowPiece(pairs[i], layer, k); dev != devEnd {
				p.devRuns++
				devEnd = dev
			}
			devEnd += uint64(e.gpu.PartBytes)
		}
		return true
	})
	p.bytes, p.hostOps = int64(stage), len(l.ops)
	return p
}

// gatherAsync submits a transfer through the gather path on a goroutine of
// its own, which holds d's lock (taken by start) until the transfer is
// submitted: building the descriptors of a large transfer takes
// milliseconds (65,536 pieces of 16 KiB: 3.5-5 ms on the H200 test
// machine), and a caller with the other direction to submit need not wait
// for them. It copies pairs first, since the caller may reuse them once
// Onboard or Offload returns. The transfer's Issued is closed when the
// goroutine has submitted it; its layer events are usable from then on
// (LayerEvent waits for it).
func (e *Engine) gatherAsync(ctx context.Context, d *direction, t *Transfer, pairs []Pair, offload bool) {
	d.gatherPairs = append(d.gatherPairs[:0], pairs...)
	run := func() {
		defer d.mu.Unlock()
		pairs := d.gatherPairs
		if t.err == nil {
			e.gather(ctx, d, t, pairs, offload)
		}
		e.stats.blocks.Add(int64(len(pairs) * e.gpu.Layers * e.gpu.Parts))
		if offload {
			e.stats.offloadBytes.Add(t.bytes)
		} else {
			e.stats.onboardBytes.Add(t.bytes)
		}
		e.submit(d, t)
	}
	if e.polled { // no goroutine of the engine's own
		run()
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		run()
	}()
}

// gather issues t's blocks through d's ring, chunk by chunk: for an
// offload, the gather kernel into a staging buffer (behind the producer's
// events, which the caller has made the kernel stream wait on) and then
// the chunk's DMAs to the host; for an onboard, the DMAs into a buffer and
// then the scatter kernel, with each layer's event recorded on the kernel
// stream after the chunk that completes the layer. A row that does not fit
// what is left of a buffer goes to the next one, or is cut where it is
// longer than a buffer. An offload's final event, recorded by submit on d's
// stream, follows every step; an onboard's layer events are all recorded
// here, also after an error (once the kernel stream has joined d's), so
// that t is done only once nothing it issued still runs.
func (e *Engine) gather(ctx context.Context, d *direction, t *Transfer, pairs []Pair, offload bool) {
	r := d.ring
	r.start()
	t.gathered = true
	e.stats.gatherTransfers.Add(1)
	part := e.gpu.PartBytes
	on := r.kernel // where an onboard's layer events are recorded
	if e.earlyLayerEvents {
		on = d.stream
	}
	recorded := 0
	record := func(upTo int) {
		for ; recorded < upTo; recorded++ {
			if err := t.layerEv[recorded].Record(on); err != nil && t.err == nil {
				t.err = fmt.Errorf("transfer: onboard (scatter) layer %d: record event: %w", recorded, err)
			}
		}
	}
	flush := func(layer int) {
		if e.flushChunk(ctx, d, t, offload); t.err == nil && !offload {
			record(layer) // the layers before this row's are in issued chunks
		}
	}
	e.rows(pairs, offload, func(i int, host uint64, n int64, layer int) bool {
		split := e.host.startsRegistration(pairs[i].HostSlot)
		if r.fill+n > r.size && n <= r.size {
			flush(layer)
		}
		for k := 0; k < int(n/part) && t.err == nil; {
			if r.fill+part > r.size {
				flush(layer)
				continue
			}
			// As much of the row as fits, as one link copy.
			m := min(int(n/part)-k, int((r.size-r.fill)/part))
			stage := r.bufs[r.next].base + uint64(r.fill)
			r.link.add(stage, host+uint64(int64(k)*part), int64(m)*part, i, split)
			for j := range m {
				dev, st := e.rowPiece(pairs[i], layer, k+j), stage+uint64(int64(j)*part)
				if offload {
					r.dev.add(st, dev, part, i, false)
				} else {
					r.dev.add(dev, st, part, i, false)
				}
			}
			r.fill += int64(m) * part
			k += m
			split = false
		}
		return t.err == nil
	})
	if t.err == nil {
		e.flushChunk(ctx, d, t, offload)
	}
	if t.err != nil {
		joinAfterError(t, r.joinStreams, r.kernel, d.stream, offload)
	}
	if !offload {
		record(e.gpu.Layers)
	}
}

// flushChunk issues the chunk built so far. An offload's chunk: the gather
// into its buffer once the buffer's last DMA has read it, then the DMAs to
// the host. An onboard's: the DMAs into its buffer once the buffer's last
// scatter has read it, then the scatter.
func (e *Engine) flushChunk(ctx context.Context, d *direction, t *Transfer, offload bool) {
	r := d.ring
	if len(r.link.ops) == 0 {
		return
	}
	if err := ctx.Err(); err != nil {
		t.err = err
		return
	}
	k := r.next
	b := &r.bufs[k]
	what := "onboard (scatter)"
	if offload {
		what = "offload (gather)"
	}
	step := func(doing string, err error) bool {
		if err != nil {
			t.err = fmt.Errorf("transfer: %s, chunk %d (staging buffer %d, from pair %d): %s: %w", what, t.gatherChunks, k, r.link.origin[0], doing, err)
		}
		return err == nil
	}
	// first fills the buffer on its stream, second reads it on its own.
	first, second := d.stream, r.kernel
	fill, read := func() error { return e.linkCopies(d, &r.link) }, func() error { return e.kernelCopies(r, r.dev.ops) }
	if offload {
		first, second = second, first
		fill, read = read, fill
	}
	if !passChunk(step, b.used && !e.skipGatherWait, b.filled, b.freed, first, second, fill, read) {
		return
	}
	t.bytes += r.link.bytes()
	t.copies += len(r.link.ops)
	t.gatherChunks++
	e.stats.descriptors.Add(int64(len(r.link.ops)))
	e.stats.gatherChunks.Add(1)
	e.stats.gatherKernelDescriptors.Add(int64(len(r.dev.ops)))
	b.used = true
	r.next = (r.next + 1) % len(r.bufs)
	r.start()
}

// start readies the ring for a chunk.
func (r *gatherRing) start() {
	r.link.reset()
	r.dev.reset()
	r.fill = 0
}

// kernelCopies runs device-to-device ops on the ring's kernel stream, at
// most MaxBatch descriptors per call.
func (e *Engine) kernelCopies(r *gatherRing, ops []cudastream.Copy) error {
	return inBatches(ops, e.maxBatch, func(b []cudastream.Copy) error { return r.kc.CopyKernel(cudastream.DeviceToDevice, b) })
}

// linkCopies submits a chunk's link copies on d's stream: the one-row ones
// in batches of at most MaxBatch descriptors, the strided ones one call
// each.
func (e *Engine) linkCopies(d *direction, l *linkOps) error {
	l.flat = l.flat[:0]
	for _, o := range l.ops {
		if o.Height == 1 {
			l.flat = append(l.flat, cudastream.Copy{Dst: o.Dst, Src: o.Src, Bytes: o.Width})
		}
	}
	for ops := l.flat; len(ops) > 0; {
		n := min(len(ops), e.maxBatch)
		if err := d.stream.CopyBatch(d.kind, ops[:n]); err != nil {
			return err
		}
		ops = ops[n:]
	}
	for _, o := range l.ops {
		if o.Height > 1 {
			if err := d.strided.Copy2D(d.kind, o); err != nil {
				return err
			}
		}
	}
	return nil
}

// errNoGatherKernel: the ring's copy kernel failed its first copy.
var errNoGatherKernel = errors.New("transfer: the device cannot run the gather/scatter path")

// Defaults of MethodAuto's switches to the gather path, read off kvtier
// probe --methods on the H200 (docs/transfer.md).
const (
	// DefaultGatherMinRunBytes is Config.GatherMinRunBytes's default.
	DefaultGatherMinRunBytes = 1 << 20
	// DefaultGatherBelowBytes is Config.GatherBelowBytes's default.
	DefaultGatherBelowBytes = 1 << 20
)

// checkGatherConfig checks the ring's settings and fills their defaults.
func checkGatherConfig(cfg *Config) error {
	switch {
	case cfg.GatherBuffers < 0 || cfg.GatherBuffers > 64:
		return fmt.Errorf("transfer: Config.GatherBuffers must be in [0, 64] (0: no gather/scatter path), got %d", cfg.GatherBuffers)
	case cfg.GatherBufferBytes < 0:
		return fmt.Errorf("transfer: Config.GatherBufferBytes must not be negative, got %d", cfg.GatherBufferBytes)
	case cfg.GatherMinRunBytes < 0:
		return fmt.Errorf("transfer: Config.GatherMinRunBytes must not be negative, got %d", cfg.GatherMinRunBytes)
	case cfg.GatherBelowBytes < 0:
		return fmt.Errorf("transfer: Config.GatherBelowBytes must not be negative, got %d", cfg.GatherBelowBytes)
	case cfg.Method == MethodGather && cfg.GatherBuffers == 0:
		return errors.New("transfer: Config.Method is gather, but Config.GatherBuffers is 0: the path needs a device staging ring")
	}
	if cfg.GatherBufferBytes == 0 {
		cfg.GatherBufferBytes = DefaultGatherBufferBytes
	}
	if cfg.GatherMinRunBytes == 0 {
		cfg.GatherMinRunBytes = DefaultGatherMinRunBytes
	}
	if cfg.GatherBelowBytes == 0 {
		cfg.GatherBelowBytes = DefaultGatherBelowBytes
	}
	if cfg.GatherBuffers > 0 && cfg.GatherBufferBytes < cfg.GPU.PartBytes {
		return fmt.Errorf("transfer: Config.GatherBufferBytes %d cannot hold one piece of %d bytes (GPU.PartBytes)", cfg.GatherBufferBytes, cfg.GPU.PartBytes)
	}
	return nil
}

// setupGather builds each direction's ring. Called by New once the streams
// exist; on error, Close releases what was built.
func (e *Engine) setupGather(cfg *Config) error {
	if cfg.GatherBuffers == 0 || cfg.Codec != codec.None { // the codec path has its own ring
		return nil
	}
	prio := [2]int{cfg.OnboardPriority, cfg.OffloadPriority}
	for i, d := range []*direction{&e.on, &e.off} {
		r, err := newGatherRing(e.dev, cfg.GatherBuffers, cfg.GatherBufferBytes, cfg.GPU.PartBytes, prio[i], cfg.KernelCopy)
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
		r.link.offload, r.plan.offload = d == &e.off, d == &e.off
		if c2, ok := d.stream.(cudastream.Copier2D); ok {
			d.strided = c2
			r.link.slot, r.plan.slot = cfg.Host.SlotBytes, cfg.Host.SlotBytes
		}
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
// MethodAuto gathers where the GPU side's pieces average below
// GatherBelowBytes and the host side coalesces into runs of at least
// GatherMinRunBytes on average and at least four times those pieces: then a
// chunk's DMAs are few and long, where direct copies would be one
// descriptor (or kernel piece) per GPU piece. Pieces of a megabyte and more
// go to batches, which move them at the link's rate both ways without
// taking SMs.
func (e *Engine) useGather(d *direction, pairs []Pair, wholeBlocks bool) bool {
	if d.ring == nil || len(pairs) == 0 {
		return false
	}
	use := e.method == MethodGather
	// A transfer smaller than one run cannot average runs that long: no
	// need for the pre-pass.
	if e.method == MethodAuto && int64(len(pairs))*e.gpu.BlockBytes() >= e.gatherMinRun {
		p := e.planGather(d, pairs, wholeBlocks)
		host := p.bytes / int64(p.hostOps)
		dev := p.bytes / int64(p.devRuns)
		use = dev < e.gatherBelow && host >= e.gatherMinRun && host >= 4*dev
	}
	return use
}
