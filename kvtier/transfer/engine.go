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

// Engine moves blocks. Its methods may be called from many goroutines.
type Engine struct {
	dev      cudastream.Device
	gpu      GPULayout
	host     HostLayout
	hostBase uint64
	now      func() time.Duration
	polled   bool              // Config.Polled
	onKernel func(CodecKernel) // Config.OnCodecKernel

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
	// skipCodecWait disables the waits before a codec scratch buffer is
	// refilled, for the test that proves it would catch the overwrite.
	skipCodecWait bool

	on, off direction

	stagingMu sync.Mutex
	staging   []stagingBuf
	// skipStagingWait disables the wait before a staging buffer is reused.
	// Tests set it to prove that they would catch the overwrite bug.
	skipStagingWait bool

	events eventPool
	stats  counters
	sums   *sumState   // nil without Config.Sums
	codec  *codecState // nil without Config.Codec

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
	cring        *codecRing              // nil: no Config.Codec
	strided      cudastream.Copier2D     // the stream's strided copies, for the ring (nil: none)
	gatherPairs  []Pair                  // gatherAsync's copy of a transfer's pairs, under mu

	row   int        // onboardRow or offloadRow of MethodAuto's table
	other *direction // the opposite direction, whose traffic MethodAuto watches
	// inflight counts the transfers of this direction submitted and not yet
	// done; MethodAuto reads the other direction's.
	inflight atomic.Int64
}

// New creates an engine and its two streams.
func New(dev cudastream.Device, cfg Config) (*Engine, error) {
	if dev == nil {
		return nil, errors.New("transfer: New: nil device")
	}
	auto, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	e := newEngine(dev, &cfg, auto)
	if err := e.openStreams(&cfg); err != nil {
		return nil, err
	}
	if err := e.setupMethod(&cfg); err != nil {
		e.on.stream.Destroy()
		e.off.stream.Destroy()
		return nil, err
	}
	// From here on, Close releases what the steps before built.
	if err := e.setupGather(&cfg); err != nil {
		e.Close()
		return nil, err
	}
	if err := e.setupSums(&cfg); err != nil {
		e.Close()
		return nil, err
	}
	if err := e.setupCodec(&cfg); err != nil {
		e.Close()
		return nil, err
	}
	if err := e.setupStaging(&cfg); err != nil {
		e.Close()
		return nil, err
	}
	e.startDirections(&cfg)
	return e, nil
}

// newEngine makes the engine's state from a validated cfg. It creates
// nothing on the device.
func newEngine(dev cudastream.Device, cfg *Config, auto autoTable) *Engine {
	e := &Engine{
		dev:      dev,
		gpu:      cfg.GPU,
		host:     cfg.Host,
		hostBase: cudastream.HostAddr(cfg.Host.Pool),
		now:      cfg.Now,
		polled:   cfg.Polled,
		onKernel: cfg.OnCodecKernel,

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
	return e
}

// openStreams creates the onboard and offload streams and ties each
// direction to its copy kind, its row of MethodAuto's table and the other
// direction. On error it leaves no stream behind.
func (e *Engine) openStreams(cfg *Config) error {
	var err error
	if e.on.stream, err = e.dev.NewStream(cfg.OnboardPriority); err != nil {
		return fmt.Errorf("transfer: onboard stream: %w", err)
	}
	if e.off.stream, err = e.dev.NewStream(cfg.OffloadPriority); err != nil {
		e.on.stream.Destroy()
		return fmt.Errorf("transfer: offload stream: %w", err)
	}
	e.on.kind, e.off.kind = cudastream.HostToDevice, cudastream.DeviceToHost
	e.on.row, e.off.row = onboardRow, offloadRow
	e.on.other, e.off.other = &e.off, &e.on
	return nil
}

// startDirections makes each direction's coalescer hand its copies to
// issueOps and, unless the engine is polled, starts the goroutine that
// completes the direction's transfers. It is New's last step.
func (e *Engine) startDirections(cfg *Config) {
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
	if e.codec != nil {
		defer d.mu.Unlock()
		e.onboardCoded(ctx, d, t, pairs)
		e.stats.blocks.Add(int64(len(pairs) * e.gpu.Layers * e.gpu.Parts))
		e.stats.onboardBytes.Add(t.bytes)
		e.submit(d, t)
		return t, nil
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
	gather := e.codec == nil && e.useGather(d, pairs, true)
	reads := d.stream // the stream whose copies read the GPU blocks
	if gather {
		reads = d.ring.kernel
	} else if e.codec != nil {
		reads = d.cring.kernel
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
	if e.codec != nil {
		if t.err == nil {
			e.offloadCoded(ctx, d, t, pairs)
		}
	} else if t.err == nil {
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
			if t.err != nil && !t.gathered && !t.coded {
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
		for _, d := range []*direction{&e.on, &e.off} {
			if d.cring != nil {
				errs = append(errs, d.cring.destroy(e.dev))
			}
		}
		if e.codec != nil && e.codec.kern != nil {
			errs = append(errs, e.codec.kern.close())
		}
		errs = append(errs, e.events.close())
	})
	return errors.Join(errs...)
}
