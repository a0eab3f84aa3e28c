// Package transfer is kvtier's copy engine: it moves KV blocks between the
// server's GPU layout and the pinned host pool, and from NVMe through pinned
// staging buffers to the GPU, at the link's speed and without ever letting a
// buffer be reused while a copy still reads or writes it.
//
// What it promises:
//
//   - Onboard (host to device) and offload (device to host) run on two
//     dedicated streams, separate from the server's compute stream and from
//     each other: the H200's two copy directions run concurrently (80 GiB/s
//     both ways), so neither starves the other, and each has its own
//     submission lock. The onboard stream has the higher priority.
//   - An offload waits for the server's event for the step that produced the
//     KV on the device (cuStreamWaitEvent), never on a host synchronisation.
//   - An onboard records one event per layer, so the compute stream can start
//     layer 0 while later layers still load (Transfer.LayerEvent).
//   - Copies are coalesced where both sides are contiguous, then submitted
//     by Config.Method: small pieces to the copy kernel (SMs move them
//     between device memory and the pinned pool at 44-47 GiB/s on the H200),
//     large ones in batches (cuMemcpyBatchAsync, or the driver's fallback
//     loop). While the other direction has work in flight the switch moves
//     down (MethodAuto): both ways at once, the kernel's PCIe traffic tops
//     out near 57 GiB/s in sum where the copy engines reach 80. Descriptor
//     buffers are reused, so submission allocates nothing per block.
//   - Where the host side of a transfer is long runs of slots (as the
//     Manager's fresh allocations are), blocks scattered on the GPU cross
//     the link in a few large or strided DMAs through a ring of device
//     staging buffers, the copy kernel gathering them into it (offloads) or
//     scattering them out of it (onboards) at HBM speed on a second stream
//     per direction (gather.go, Config.GatherBuffers). Both directions then
//     run at once near the link's duplex rate for small blocks too, and the
//     SMs work only a small part of each chunk's time.
//   - A Transfer is done only when the device has completed its copies
//     (design.md, invariant 2). The memory it reads or writes — host slots,
//     GPU blocks — MUST NOT be reused by the caller before Done is closed, even
//     after Wait returned early because its context ended. Staging buffers
//     are the engine's own and are reused only after the event of the copy
//     that read them has completed (invariant 3).
//   - Cancellation stops issuing new copies; what was issued still completes
//     before the Transfer is done, and the Transfer reports the context's
//     error: its data MUST NOT be used.
//   - With Config.Polled the engine runs no goroutine of its own: Poll
//     completes, in stream order, the transfers the device has finished,
//     and runs their OnDone functions on its caller's goroutine. On the
//     simulated device's virtual clock that makes a replay of the serving
//     code deterministic (kvtier/replay).
//   - With Config.Sums, every offload and staged onboard also sums its
//     blocks on the GPU (internal/checksum's word sum, over each block's
//     bytes in host order) and is done only once the sums are in host
//     memory (Transfer.Sums, sums.go): the NVMe tier's checksums, without
//     the CPU reading a payload.
package transfer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"kvtier.dev/cudastream"
)

// Config configures an Engine.
type Config struct {
	// GPU is where the server keeps KV blocks.
	GPU GPULayout
	// Host is the pinned host pool. Its SlotBytes must hold a whole block.
	Host HostLayout
	// Staging holds the pinned buffers for NVMe (or pageable) onboards, each
	// a whole number of slots of Host.SlotBytes (at least one). Two or more
	// make a ring: the engine reads into buffer k while buffer k-1 is being
	// copied to the device. They come from kvtier/pinned and MUST be
	// registered with the device. Optional.
	Staging [][]byte
	// MaxBatch caps the descriptors per batched copy call or copy-kernel
	// call (default 4096).
	MaxBatch int
	// Method is how descriptors are submitted (default MethodAuto: the
	// copy kernel for small pieces, batches for large ones, with a higher
	// switch for onboards while offloads are in flight).
	Method Method
	// KernelBelowBytes is MethodAuto's switch: a call whose descriptors
	// average fewer bytes goes to the copy kernel. Default
	// DefaultKernelBelowBytes (64 KiB): 16 KiB blocks scattered on the GPU
	// go to the kernel, 64 KiB blocks and up to cuMemcpyBatchAsync.
	KernelBelowBytes int64
	// OnboardContendedKernelBelowBytes replaces KernelBelowBytes for
	// onboards while offloads are in flight (see MethodAuto for the
	// measurements). Default DefaultOnboardContendedKernelBelowBytes (256
	// KiB), or KernelBelowBytes where only that is set: while offloads run,
	// an onboard of 64 KiB blocks goes to the kernel and one of 256 KiB
	// blocks to batches.
	OnboardContendedKernelBelowBytes int64
	// KernelCopy tunes the copy kernel (CTAs bound the SMs it takes from
	// the server's compute). Zero fields take cudastream's defaults.
	KernelCopy cudastream.KernelCopyOptions
	// OnboardPriority and OffloadPriority are stream priorities; lower runs
	// first (CUDA's convention). Defaults: -1 and 0.
	OnboardPriority, OffloadPriority int
	// GatherBuffers and GatherBufferBytes give each direction a ring of
	// device staging buffers for the gather/scatter path (MethodGather, and
	// MethodAuto's choice of it; see gather.go): GatherBuffers buffers of
	// GatherBufferBytes (default DefaultGatherBufferBytes) per direction,
	// and a second stream per direction for the gather and scatter
	// kernels. Zero GatherBuffers means no ring: Auto never gathers and
	// MethodGather is refused. DefaultGatherBuffers of the default size
	// take 96 MiB of device memory for both directions.
	GatherBuffers     int
	GatherBufferBytes int64
	// GatherMinRunBytes and GatherBelowBytes are MethodAuto's switches to
	// the gather path: a transfer gathers when its GPU side's pieces
	// average fewer than GatherBelowBytes and its host side coalesces into
	// runs averaging at least GatherMinRunBytes and at least four times
	// those pieces (defaults DefaultGatherMinRunBytes and
	// DefaultGatherBelowBytes; kvtier probe --methods measures both).
	GatherMinRunBytes, GatherBelowBytes int64
	// Sums makes every offload and staged onboard also compute, on the
	// GPU, the word sum (internal/checksum's WordSum) of each block it
	// moved, over the block's bytes in host order: Transfer.Sums
	// (sums.go). Onboards from the pool are not summed: their bytes came
	// from an offload, or were checked on their way into the pool. The device
	// MUST implement cudastream.WordSummer (a TimingOnly simulator does
	// not) and GPU.PartBytes be a multiple of 8; New fails otherwise,
	// wrapping cudastream.ErrNotSupported where the device is the cause.
	Sums bool
	// Now is the clock used for Transfer.Duration (default: wall time since
	// the engine started). Replays pass the simulator's virtual clock.
	Now func() time.Duration
	// Polled makes the engine run no goroutine of its own: a transfer is
	// done when a call to Engine.Poll finds its events complete, and its
	// OnDone functions run inside that Poll. The gather path is submitted
	// on the caller's goroutine. A discrete-event replay uses it on the
	// simulator's virtual clock, so that completions happen at modelled
	// times in a deterministic order, and nothing waits on the host. Sums
	// and staged onboards (OnboardStaged) wait on the host and are
	// refused.
	Polled bool
}

// Engine moves blocks. Its methods may be called from many goroutines.
type Engine struct {
	dev      cudastream.Device
	gpu      GPULayout
	host     HostLayout
	hostBase uint64
	now      func() time.Duration
	polled   bool // Config.Polled

	method   Method
	auto     autoTable
	maxBatch int

	gatherMinRun int64
	gatherBelow  int64
	// skipGatherWait disables the waits before a device staging buffer is
	// refilled, for the test that proves it would catch the overwrite.
	skipGatherWait bool
	// earlyLayerEvents records the scatter path's layer events after the
	// DMAs instead of after the scatters, for the test that proves it
	// would catch a layer readied before its bytes are in place.
	earlyLayerEvents bool

	on, off direction

	stagingMu sync.Mutex
	staging   []stagingBuf
	// skipStagingWait disables the wait before a staging buffer is reused.
	// Tests set it to prove that they would catch the overwrite bug.
	skipStagingWait bool

	events eventPool
	stats  counters
	sums   *sumState // nil without Config.Sums

	closeOnce sync.Once
	closed    atomic.Bool
	wg        sync.WaitGroup
}

// direction is one stream with its submission state.
type direction struct {
	mu      sync.Mutex // serialises submissions to stream
	stream  cudastream.Stream
	kind    cudastream.CopyKind
	co      coalescer // streams into issueOps (begin, end)
	call    issueCall
	pending chan *Transfer // to the completer, in stream order
	// queue holds, with Config.Polled, the transfers submitted and not yet
	// done, in stream order from qhead; guarded by mu.
	queue []*Transfer
	qhead int

	kc           cudastream.KernelCopier // nil: the stream has no copy kernel
	kernelBroken bool                    // CopyKernel said ErrNotSupported: Auto uses batches
	ring         *gatherRing             // nil: no gather/scatter path
	strided      cudastream.Copier2D     // the stream's strided copies, for the ring (nil: none)
	gatherPairs  []Pair                  // gatherAsync's copy of a transfer's pairs, under mu

	row   int        // onboardRow or offloadRow of MethodAuto's table
	other *direction // the opposite direction, whose traffic MethodAuto watches
	// inflight counts the transfers of this direction submitted and not yet
	// done; MethodAuto reads the other direction's.
	inflight atomic.Int64
}

type stagingBuf struct {
	layout HostLayout
	base   uint64
	ev     cudastream.Event
	used   bool // ev has been recorded after a copy that reads the buffer
	pairs  []Pair
}

// Stats is a snapshot of the engine's counters.
type Stats struct {
	OnboardBytes, OffloadBytes int64
	Transfers                  int64
	// Blocks and Descriptors show what coalescing saved: each block of each
	// layer is one copy before coalescing.
	Blocks, Descriptors int64
	// KernelDescriptors counts the descriptors the copy kernel moved (the
	// rest went to batches or single copies).
	KernelDescriptors int64
	// ContendedDescriptors counts the descriptors submitted while the other
	// direction had work in flight (MethodAuto's busy column).
	ContendedDescriptors int64
	// StagingWaits counts staged onboards that waited for a staging
	// buffer's previous copy before refilling it.
	StagingWaits int64
	// GatherTransfers counts the transfers that took the gather/scatter
	// path, GatherChunks the device staging chunks they moved (their link
	// descriptors are in Descriptors), and GatherKernelDescriptors the
	// device-side pieces the gather and scatter kernels copied.
	GatherTransfers, GatherChunks, GatherKernelDescriptors int64
}

// counters are the live counters behind Stats.
type counters struct {
	onboardBytes, offloadBytes, transfers  atomic.Int64
	blocks, descriptors, kernelDescriptors atomic.Int64
	contendedDescriptors, stagingWaits     atomic.Int64
	gatherTransfers, gatherChunks          atomic.Int64
	gatherKernelDescriptors                atomic.Int64
}

// New creates an engine and its two streams.
func New(dev cudastream.Device, cfg Config) (*Engine, error) {
	if dev == nil {
		return nil, errors.New("transfer: New: nil device")
	}
	if err := cfg.GPU.Validate(); err != nil {
		return nil, err
	}
	if cfg.Host.SlotBytes < cfg.GPU.BlockBytes() {
		return nil, fmt.Errorf("transfer: Config.Host.SlotBytes %d cannot hold a block of %d bytes", cfg.Host.SlotBytes, cfg.GPU.BlockBytes())
	}
	if r := cfg.Host.RegistrationBytes; r < 0 || (r > 0 && r < int64(len(cfg.Host.Pool)) && r%cfg.Host.SlotBytes != 0) {
		return nil, fmt.Errorf("transfer: Config.Host.RegistrationBytes %d is not a multiple of SlotBytes %d: a slot would straddle two registrations", r, cfg.Host.SlotBytes)
	}
	if o := cfg.Host.RegistrationOffset; o < 0 || o%cfg.Host.SlotBytes != 0 || (o > 0 && o >= cfg.Host.RegistrationBytes) {
		return nil, fmt.Errorf("transfer: Config.Host.RegistrationOffset %d is not a multiple of SlotBytes %d below RegistrationBytes %d: a slot would straddle two registrations", o, cfg.Host.SlotBytes, cfg.Host.RegistrationBytes)
	}
	if cfg.Host.Slots() == 0 {
		return nil, fmt.Errorf("transfer: Config.Host.Pool (%d bytes) holds no slot of %d bytes", len(cfg.Host.Pool), cfg.Host.SlotBytes)
	}
	for i, b := range cfg.Staging {
		if int64(len(b)) < cfg.Host.SlotBytes {
			return nil, fmt.Errorf("transfer: Config.Staging[%d] (%d bytes) holds no slot of %d bytes", i, len(b), cfg.Host.SlotBytes)
		}
	}
	if cfg.MaxBatch < 0 {
		return nil, fmt.Errorf("transfer: Config.MaxBatch must not be negative, got %d", cfg.MaxBatch)
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = 4096
	}
	if cfg.Method >= NumMethods {
		return nil, fmt.Errorf("transfer: Config.Method %d is not a method (auto, batch, kernel, loop or gather)", cfg.Method)
	}
	if err := checkGatherConfig(&cfg); err != nil {
		return nil, err
	}
	auto, err := newAutoTable(&cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Polled && cfg.Sums {
		return nil, errors.New("transfer: Config.Polled and Config.Sums: a polled engine cannot wait on the host for the sums")
	}
	if cfg.OnboardPriority == 0 && cfg.OffloadPriority == 0 {
		cfg.OnboardPriority = -1
	}
	e := &Engine{
		dev:      dev,
		gpu:      cfg.GPU,
		host:     cfg.Host,
		hostBase: cudastream.HostAddr(cfg.Host.Pool),
		now:      cfg.Now,
		polled:   cfg.Polled,

		method:   cfg.Method,
		auto:     auto,
		maxBatch: cfg.MaxBatch,

		gatherMinRun: cfg.GatherMinRunBytes,
		gatherBelow:  cfg.GatherBelowBytes,
	}
	e.events.dev = dev
	if e.now == nil {
		start := time.Now()
		e.now = func() time.Duration { return time.Since(start) }
	}
	if e.on.stream, err = dev.NewStream(cfg.OnboardPriority); err != nil {
		return nil, fmt.Errorf("transfer: onboard stream: %w", err)
	}
	if e.off.stream, err = dev.NewStream(cfg.OffloadPriority); err != nil {
		e.on.stream.Destroy()
		return nil, fmt.Errorf("transfer: offload stream: %w", err)
	}
	e.on.kind, e.off.kind = cudastream.HostToDevice, cudastream.DeviceToHost
	e.on.row, e.off.row = onboardRow, offloadRow
	e.on.other, e.off.other = &e.off, &e.on
	if err := e.setupMethod(&cfg); err != nil {
		e.on.stream.Destroy()
		e.off.stream.Destroy()
		return nil, err
	}
	if err := e.setupGather(&cfg); err != nil {
		e.Close()
		return nil, err
	}
	if err := e.setupSums(&cfg); err != nil {
		e.Close()
		return nil, err
	}
	for _, b := range cfg.Staging {
		ev, err := dev.NewEvent(cudastream.EventOptions{})
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("transfer: staging event: %w", err)
		}
		l := HostLayout{Pool: b, SlotBytes: cfg.Host.SlotBytes}
		e.staging = append(e.staging, stagingBuf{layout: l, base: cudastream.HostAddr(b), ev: ev, pairs: make([]Pair, 0, l.Slots())})
	}
	for _, d := range []*direction{&e.on, &e.off} {
		d.co.limit = cfg.MaxBatch
		d.co.emit = func(ops []cudastream.Copy, origin []int32) bool { return e.issueOps(d, ops, origin) }
		if cfg.Polled {
			continue
		}
		d.pending = make(chan *Transfer, 1024)
		e.wg.Add(1)
		go e.complete(d)
	}
	return e, nil
}

// Stats returns a snapshot of the engine's counters; each is read
// atomically, the set is not.
func (e *Engine) Stats() Stats {
	c := &e.stats
	return Stats{
		OnboardBytes: c.onboardBytes.Load(), OffloadBytes: c.offloadBytes.Load(),
		Transfers: c.transfers.Load(), Blocks: c.blocks.Load(), Descriptors: c.descriptors.Load(),
		KernelDescriptors: c.kernelDescriptors.Load(), ContendedDescriptors: c.contendedDescriptors.Load(),
		StagingWaits:    c.stagingWaits.Load(),
		GatherTransfers: c.gatherTransfers.Load(), GatherChunks: c.gatherChunks.Load(),
		GatherKernelDescriptors: c.gatherKernelDescriptors.Load(),
	}
}

// complete waits, in stream order, for each submitted transfer's last event.
func (e *Engine) complete(d *direction) {
	defer e.wg.Done()
	for t := range d.pending {
		t.await()
	}
}

// ErrClosed is returned by submissions to a closed engine.
var ErrClosed = errors.New("transfer: engine closed")

// Onboard copies blocks from their host slots to the GPU, layer by layer,
// recording one event per layer. The host slots and GPU blocks MUST NOT be
// reused until the Transfer is done; pairs may be reused once Onboard
// returns. Invalid pairs are rejected before any copy is issued.
func (e *Engine) Onboard(ctx context.Context, pairs []Pair) (*Transfer, error) {
	d := &e.on
	t, err := e.start(d, pairs, e.gpu.Layers)
	if err != nil {
		return nil, err
	}
	if e.useGather(d, pairs, false) {
		e.gatherAsync(ctx, d, t, pairs, false)
		return t, nil
	}
	defer d.mu.Unlock()
	for l := 0; l < e.gpu.Layers && t.err == nil; l++ {
		d.begin(ctx, t, "onboard layer", l)
		d.co.addLayer(&e.gpu, &e.host, e.hostBase, pairs, l, true)
		d.end()
		if err := t.layerEv[l].Record(d.stream); err != nil && t.err == nil {
			t.err = fmt.Errorf("transfer: onboard layer %d: record event: %w", l, err)
		}
	}
	e.stats.blocks.Add(int64(len(pairs) * e.gpu.Layers * e.gpu.Parts))
	e.stats.onboardBytes.Add(t.bytes)
	e.submit(d, t)
	return t, nil
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

// Offload copies blocks from the GPU to their host slots once the events
// in after have completed (the server's events for the steps that produced
// them; none, or nil ones, for none), waiting for them on the device. Each block moves layer after layer, so a block-first GPU layout
// moves as one copy per block. The host slots MUST NOT be read as KV, nor the
// GPU blocks reused, until the Transfer is done.
func (e *Engine) Offload(ctx context.Context, pairs []Pair, after ...cudastream.Event) (*Transfer, error) {
	d := &e.off
	t, err := e.start(d, pairs, 0)
	if err != nil {
		return nil, err
	}
	gather := e.useGather(d, pairs, true)
	reads := d.stream // the stream whose copies read the GPU blocks
	if gather {
		reads = d.ring.kernel
	}
	for _, ev := range after {
		if ev == nil || t.err != nil {
			continue
		}
		if err := reads.WaitEvent(ev); err != nil {
			t.err = fmt.Errorf("transfer: offload: wait for the producer's event: %w", err)
		}
	}
	if gather {
		e.gatherAsync(ctx, d, t, pairs, true)
		return t, nil
	}
	defer d.mu.Unlock()
	if t.err == nil {
		d.begin(ctx, t, "offload", -1)
		d.co.addBlocks(&e.gpu, &e.host, e.hostBase, pairs, false)
		d.end()
	}
	e.stats.blocks.Add(int64(len(pairs) * e.gpu.Layers * e.gpu.Parts))
	e.stats.offloadBytes.Add(t.bytes)
	e.submit(d, t)
	return t, nil
}

// start checks pairs and makes their transfer on d, with layers per-layer
// events (0 for none). On success d.mu is held, which the caller MUST
// unlock, and the transfer counts as d's work in flight.
func (e *Engine) start(d *direction, pairs []Pair, layers int) (*Transfer, error) {
	if err := checkPairs(&e.gpu, &e.host, pairs); err != nil {
		return nil, err
	}
	t, err := e.newTransfer(d.kind, layers)
	if err != nil {
		return nil, err
	}
	if e.sums != nil && d == &e.off {
		t.sumBlocks = make([]int32, len(pairs))
		for i, p := range pairs {
			t.sumBlocks[i] = p.GPUBlock
		}
	}
	d.mu.Lock()
	if e.closed.Load() {
		d.mu.Unlock()
		t.release()
		return nil, ErrClosed
	}
	t.startInFlight(d)
	return t, nil
}

// begin makes d's coalescer issue what it gathers, by the engine's method,
// as part of t; what and n (-1 for none) name the step in an error. Called
// with d.mu held; end issues the rest.
func (d *direction) begin(ctx context.Context, t *Transfer, what string, n int) {
	d.co.reset()
	d.call = issueCall{ctx: ctx, t: t, what: what, n: n}
}

// end issues what d's coalescer still holds.
func (d *direction) end() {
	d.co.flush()
	d.call = issueCall{}
}

// issueCall is the call being coalesced on a direction, for issueOps.
type issueCall struct {
	ctx  context.Context
	t    *Transfer
	what string
	n    int
}

// issueOps is d's coalescer's emit: it submits ops (at most MaxBatch) and
// records them in the call's transfer, or records why it stopped: an error,
// or the end of the call's context.
func (e *Engine) issueOps(d *direction, ops []cudastream.Copy, origin []int32) bool {
	c := &d.call
	t := c.t
	if err := c.ctx.Err(); err != nil {
		t.err = err
		return false
	}
	kernel, err := e.submitOps(d, ops)
	if err != nil {
		what := c.what
		if c.n >= 0 {
			what = fmt.Sprintf("%s %d", what, c.n)
		}
		i := d.co.emitted
		t.err = fmt.Errorf("transfer: %s: descriptors %d..%d (from pair %d): %w", what, i, i+len(ops)-1, origin[0], err)
		return false
	}
	for _, op := range ops {
		t.bytes += op.Bytes
	}
	t.copies += len(ops)
	if kernel {
		t.kernelCopies += len(ops)
	}
	e.stats.descriptors.Add(int64(len(ops)))
	return true
}

// submit records t's final event after everything t issued and hands t to
// the completer. Called with d.mu held.
func (e *Engine) submit(d *direction, t *Transfer) {
	if n := len(t.layerEv); n > 0 {
		t.final = t.layerEv[n-1]
		// Layers not issued after an error still get recorded, so that
		// nothing waiting on them waits forever; the error marks their data
		// invalid. (The scatter path records its own, on its kernel stream,
		// after everything it issued.)
		for l := range t.layerEv {
			if t.err != nil && !t.gathered {
				t.layerEv[l].Record(d.stream)
			}
		}
	} else {
		if err := t.final.Record(d.stream); err != nil && t.err == nil {
			t.err = fmt.Errorf("transfer: record completion event: %w", err)
		}
	}
	e.enqueueSums(t)
	e.stats.transfers.Add(1)
	close(t.issued)
	if e.polled {
		d.queue = append(d.queue, t)
		return
	}
	d.pending <- t
}

// Poll completes, in stream order, the transfers of a polled engine
// (Config.Polled) whose copies the device has completed: it marks their
// layers and then them done and runs their OnDone functions, on the
// caller's goroutine and with no lock held, so that they may submit more
// transfers. It returns how many transfers it completed. It never blocks
// the host: it queries events. Onboards are completed before offloads. On
// the simulator's virtual clock, poll after moving the clock
// (Sim.AdvanceTo). Poll on an engine that is not polled completes nothing.
func (e *Engine) Poll() int {
	if !e.polled {
		return 0
	}
	n := 0
	for _, d := range [2]*direction{&e.on, &e.off} {
		for {
			d.mu.Lock()
			if d.qhead == len(d.queue) {
				d.queue, d.qhead = d.queue[:0], 0
				d.mu.Unlock()
				break
			}
			t := d.queue[d.qhead]
			done, err := t.poll()
			if !done {
				d.mu.Unlock()
				break
			}
			d.queue[d.qhead] = nil
			d.qhead++
			d.mu.Unlock()
			t.finish(err)
			n++
		}
	}
	return n
}

// Source reads blocks for a staged onboard, for example from the NVMe tier.
type Source interface {
	// ReadBlock reads block i of the request into dst, which is one host
	// slot long and lies in a pinned staging buffer.
	ReadBlock(ctx context.Context, i int, dst []byte) error
}

// OnboardStaged reads blocks from src through the pinned staging ring and
// copies them to the GPU blocks gpuBlocks[i]. It reads into buffer k while
// buffer k-1 is still being copied, and waits for the copy that last read a
// buffer before overwriting it. Staged onboards run one at a time. Each
// staging buffer carries whole blocks, so every layer lands with the last
// block: the returned Transfer has one event per layer, as an Onboard's,
// all recorded after the last copy, so that a caller waits on layers the
// same way whatever the source.
func (e *Engine) OnboardStaged(ctx context.Context, src Source, gpuBlocks []int32) (*Transfer, error) {
	if e.polled {
		return nil, errors.New("transfer: OnboardStaged: a polled engine (Config.Polled) does not stage: refilling a staging buffer waits on the host")
	}
	if len(e.staging) == 0 {
		return nil, errors.New("transfer: OnboardStaged: the engine has no staging buffers (Config.Staging)")
	}
	for i, b := range gpuBlocks {
		if b < 0 || int(b) >= e.gpu.NumBlocks {
			return nil, fmt.Errorf("transfer: OnboardStaged: block %d: GPU block %d outside the layout's %d blocks", i, b, e.gpu.NumBlocks)
		}
	}
	t, err := e.newTransfer(cudastream.HostToDevice, e.gpu.Layers)
	if err != nil {
		return nil, err
	}
	if e.sums != nil {
		t.sumBlocks = append([]int32(nil), gpuBlocks...)
	}
	// Under the onboard lock, which Close takes to mark the engine closed:
	// once Close has started waiting, no staged onboard can join.
	e.on.mu.Lock()
	if e.closed.Load() {
		e.on.mu.Unlock()
		t.release()
		return nil, ErrClosed
	}
	t.startInFlight(&e.on)
	e.wg.Add(1)
	e.on.mu.Unlock()
	go func() {
		defer e.wg.Done()
		e.stagingMu.Lock()
		defer e.stagingMu.Unlock()
		e.runStaged(ctx, src, gpuBlocks, t)
		d := &e.on
		d.mu.Lock()
		for l, ev := range t.layerEv { // the last one is t.final
			if err := ev.Record(d.stream); err != nil && t.err == nil {
				t.err = fmt.Errorf("transfer: staged onboard: record layer %d event: %w", l, err)
			}
		}
		d.mu.Unlock()
		e.enqueueSums(t)
		close(t.issued)
		e.stats.transfers.Add(1)
		e.stats.onboardBytes.Add(t.bytes)
		t.await()
	}()
	return t, nil
}

func (e *Engine) runStaged(ctx context.Context, src Source, gpuBlocks []int32, t *Transfer) {
	next := 0
	for k := 0; next < len(gpuBlocks); k++ {
		buf := &e.staging[k%len(e.staging)]
		if buf.used && !e.skipStagingWait {
			e.stats.stagingWaits.Add(1)
			if err := buf.ev.Synchronize(); err != nil {
				t.err = fmt.Errorf("transfer: staged onboard: wait for staging buffer %d: %w", k%len(e.staging), err)
				return
			}
		}
		buf.pairs = buf.pairs[:0]
		for s := 0; s < buf.layout.Slots() && next < len(gpuBlocks); s++ {
			if err := ctx.Err(); err != nil {
				t.err = err
				return
			}
			if err := src.ReadBlock(ctx, next, buf.layout.Slot(int32(s))); err != nil {
				t.err = fmt.Errorf("transfer: staged onboard: read block %d: %w", next, err)
				return
			}
			buf.pairs = append(buf.pairs, Pair{GPUBlock: gpuBlocks[next], HostSlot: int32(s)})
			next++
		}
		d := &e.on
		d.mu.Lock()
		d.begin(ctx, t, "staged onboard, staging buffer", k%len(e.staging))
		d.co.addBlocks(&e.gpu, &buf.layout, buf.base, buf.pairs, true)
		d.end()
		err := buf.ev.Record(d.stream)
		d.mu.Unlock()
		buf.used = true
		e.stats.blocks.Add(int64(len(buf.pairs) * e.gpu.Layers * e.gpu.Parts))
		if t.err != nil {
			return
		}
		if err != nil {
			t.err = fmt.Errorf("transfer: staged onboard: record staging event: %w", err)
			return
		}
	}
}

// Close waits for submitted transfers to complete, then releases the
// streams and pooled events. Transfers not yet released keep their events.
func (e *Engine) Close() error {
	var errs []error
	e.closeOnce.Do(func() {
		for _, d := range []*direction{&e.on, &e.off} {
			d.mu.Lock()
			e.closed.Store(true)
			if d.pending != nil {
				close(d.pending)
			}
			d.mu.Unlock()
		}
		e.wg.Wait()
		for _, d := range []*direction{&e.on, &e.off} {
			e.drainPolled(d)
		}
		for _, d := range []*direction{&e.on, &e.off} {
			if d.stream != nil {
				errs = append(errs, d.stream.Destroy())
			}
		}
		for _, b := range e.staging {
			errs = append(errs, b.ev.Destroy())
		}
		for _, d := range []*direction{&e.on, &e.off} {
			if d.ring != nil {
				errs = append(errs, d.ring.destroy(e.dev))
			}
		}
		if e.sums != nil {
			errs = append(errs, e.sums.destroy(e.dev))
		}
		errs = append(errs, e.events.close())
	})
	return errors.Join(errs...)
}

// drainPolled completes, after Close has marked the engine closed, the
// transfers a polled engine still holds: it waits for each on the host, in
// stream order (on the virtual clock this moves the clock).
func (e *Engine) drainPolled(d *direction) {
	for {
		d.mu.Lock()
		if d.qhead == len(d.queue) {
			d.queue, d.qhead = nil, 0
			d.mu.Unlock()
			return
		}
		t := d.queue[d.qhead]
		d.queue[d.qhead] = nil
		d.qhead++
		d.mu.Unlock()
		t.await()
	}
}

// eventPool recycles events between transfers.
type eventPool struct {
	dev  cudastream.Device
	mu   sync.Mutex
	free []cudastream.Event
}

func (p *eventPool) get() (cudastream.Event, error) {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		ev := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return ev, nil
	}
	p.mu.Unlock()
	return p.dev.NewEvent(cudastream.EventOptions{BlockingSync: true})
}

func (p *eventPool) put(ev cudastream.Event) {
	p.mu.Lock()
	p.free = append(p.free, ev)
	p.mu.Unlock()
}

func (p *eventPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, ev := range p.free {
		errs = append(errs, ev.Destroy())
	}
	p.free = nil
	return errors.Join(errs...)
}
