package replay

import (
	"errors"
	"fmt"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/transfer"
)

// With Config.Mover "device" the copies between the GPU and the host tier
// are made by the code that serves: kvtier.DeviceMover over a
// transfer.Engine, on cudastream's simulated device with a virtual clock.
// The device is TimingOnly (its memory stores nothing) and the host pool is
// reserved address space with no memory behind it, so a 40 GiB GPU tier
// and a 256 GiB host tier cost the replay nothing but their bookkeeping.
// The engine is polled (transfer.Config.Polled): the replay's event loop
// moves the device's clock to its next event (Sim.NextEvent) before each
// of its own that comes later, and Engine.Poll completes there what the
// device has finished, so every copy completes at its modelled time, in
// one goroutine, in the same order on every run.
//
// Copies to and from NVMe stay on the model's channels (link.go): the
// mover's NVMe paths write real files through kvtier/nvme, hundreds of GiB
// in a replay of the bundled trace.

// devicePath is the replay's simulated device and the serving stack on it.
type devicePath struct {
	sim    *cudastream.Sim
	eng    *transfer.Engine
	mv     *kvtier.DeviceMover
	region cudastream.DevicePtr
	pool   []byte // unbacked; the sim's registrations are in chunks of regBytes
	regs   [][]byte

	inFlight int   // ops handed to mv and not completed
	err      error // the first op that failed: a replay's copies never fail
	free     []*relay

	// busyToGPU and busyFromGPU are the time the device's copy engines
	// spent copying, per direction (latencies included), set by close.
	busyToGPU, busyFromGPU time.Duration
}

// devicePathStats are the counts of a device path's mover and engine.
type devicePathStats struct {
	mover         kvtier.MoverStats
	engine        transfer.Stats
	registrations int // of the host pool with the simulated device
}

// newDevicePath builds the device for e's GPU and host tiers: hostSlots
// slots of e.blockBytes in the pool (at least one).
func newDevicePath(e *engine, hostSlots int64) (*devicePath, error) {
	h200 := cudastream.H200Link()
	// The links are the cost model's: the host link's bandwidth both ways
	// and its latency per copy call; the per-descriptor, per-event and
	// per-launch costs are those measured on the H200 (cudastream.H200Link).
	link := cudastream.LinkModel{
		HtoDBytesPerSec: e.hostLink.BandwidthBytesPerS, DtoHBytesPerSec: e.hostLink.BandwidthBytesPerS,
		CopyLatency: e.hostLink.Latency, DescriptorCost: h200.DescriptorCost, EventCost: h200.EventCost,
		KernelLaunch: h200.KernelLaunch,
	}
	layers, parts := e.model.Layers, 2
	if e.model.IsMLA() {
		parts = 1
	}
	if layers < 1 || e.blockBytes%int64(layers*parts) != 0 {
		return nil, cfgErr("mover", "device: a block of %d bytes does not split into %d layers of %d parts", e.blockBytes, layers, parts)
	}
	gpuBytes := e.gpuSlots * e.blockBytes
	// MemoryBytes leaves room for the sim's rounding of the one allocation.
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: gpuBytes + 256, TimingOnly: true, Link: link, Clock: cudastream.SimVirtualClock})
	if err != nil {
		return nil, fmt.Errorf("replay: mover device: %w", err)
	}
	d := &devicePath{sim: sim}
	if err := d.build(e, hostSlots, layers, parts, gpuBytes); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

// maxRegistration is the most the simulator registers at once (it refuses
// 512 GiB and more, as the driver does).
const maxRegistration = 256 << 30

func (d *devicePath) build(e *engine, hostSlots int64, layers, parts int, gpuBytes int64) error {
	var err error
	if d.region, err = d.sim.Alloc(gpuBytes); err != nil {
		return fmt.Errorf("replay: mover device: the GPU tier: %w", err)
	}
	gpu, err := transfer.BlockFirstLayout(d.region, layers, parts, int(e.gpuSlots), e.blockBytes/int64(layers*parts))
	if err != nil {
		return fmt.Errorf("replay: mover device: %w", err)
	}
	poolBytes := hostSlots * e.blockBytes
	if d.pool, err = unbacked(poolBytes); err != nil {
		return err
	}
	regBytes := max(1, maxRegistration/e.blockBytes) * e.blockBytes
	for off := int64(0); off < poolBytes; off += regBytes {
		r := d.pool[off:min(poolBytes, off+regBytes)]
		if err := d.sim.HostRegister(r); err != nil {
			return fmt.Errorf("replay: mover device: register the host pool: %w", err)
		}
		d.regs = append(d.regs, r)
	}
	host := transfer.HostLayout{Pool: d.pool, SlotBytes: e.blockBytes, RegistrationBytes: regBytes}
	if d.eng, err = transfer.New(d.sim, transfer.Config{GPU: gpu, Host: host, Polled: true, Now: d.sim.Clock().Now}); err != nil {
		return fmt.Errorf("replay: mover device: %w", err)
	}
	if d.mv, err = kvtier.NewDeviceMover(kvtier.DeviceMoverConfig{Engine: d.eng, Host: host, BlockBytes: e.blockBytes}); err != nil {
		return fmt.Errorf("replay: mover device: %w", err)
	}
	return nil
}

// next is the device's next event, if it has work.
func (d *devicePath) next() (time.Duration, bool) { return d.sim.NextEvent() }

// advance moves the device's clock to at and completes what it finished.
func (d *devicePath) advance(at time.Duration) error {
	if err := d.sim.AdvanceTo(at); err != nil {
		return fmt.Errorf("replay: mover device: %w", err)
	}
	d.eng.Poll()
	return d.err
}

// close releases the device; it reports the engine's and the sim's errors.
func (d *devicePath) close() error {
	var errs []error
	if d.mv != nil {
		errs = append(errs, d.mv.Close())
	}
	if d.eng != nil {
		errs = append(errs, d.eng.Close())
	}
	st := d.sim.LinkStats()
	d.busyToGPU, d.busyFromGPU = st.Busy[cudastream.HostToDevice], st.Busy[cudastream.DeviceToHost]
	for _, r := range d.regs {
		errs = append(errs, d.sim.HostUnregister(r))
	}
	if d.region != 0 {
		errs = append(errs, d.sim.Free(d.region))
	}
	errs = append(errs, d.sim.Close())
	if d.pool != nil {
		errs = append(errs, freeUnbacked(d.pool))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("replay: mover device: close: %w", err)
	}
	return nil
}

// relay is one Submit's ops for the DeviceMover: their indexes in the
// manager's batch and the requests waiting for them. Its Complete passes
// each completion on to the manager's batch, then does the replay's
// bookkeeping, as copyDone does for the model's channels.
type relay struct {
	e      *engine
	parent *kvtier.Batch
	b      *kvtier.Batch
	ops    []kvtier.MoveOp
	idx    []int
	req    []*request
	left   int
}

// relayFor returns a free relay for batch t.
func (d *devicePath) relayFor(e *engine, t *kvtier.Batch) *relay {
	var r *relay
	if n := len(d.free); n > 0 {
		r, d.free = d.free[n-1], d.free[:n-1]
	} else {
		r = &relay{e: e}
	}
	r.parent = t
	return r
}

func (r *relay) add(i int, req *request) {
	r.ops = append(r.ops, r.parent.Ops[i])
	r.idx = append(r.idx, i)
	r.req = append(r.req, req)
}

// submit hands r's ops to the DeviceMover.
func (d *devicePath) submit(r *relay) {
	r.left = len(r.ops)
	d.inFlight += r.left
	r.e.inFlight += r.left
	r.b = kvtier.NewRelayBatch(r.ops, r)
	if err := d.mv.Submit(r.b); err != nil { // it never fails a Submit; be strict all the same
		d.fail(fmt.Errorf("replay: mover device: Submit: %w", err))
	}
}

func (d *devicePath) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

// Complete implements kvtier.Relay.
func (r *relay) Complete(i int, err error) {
	e, d := r.e, r.e.dev
	parent, pi, req, op := r.parent, r.idx[i], r.req[i], r.ops[i]
	r.left--
	if r.left == 0 { // nothing of r is read after this: it may serve the next Submit
		r.parent, r.b = nil, nil
		r.ops, r.idx, r.req = r.ops[:0], r.idx[:0], r.req[:0]
		clear(r.req[:cap(r.req)])
		d.free = append(d.free, r)
	}
	d.inFlight--
	e.inFlight--
	if err != nil {
		d.fail(fmt.Errorf("replay: mover device: %v slot %d to %v slot %d: %w", op.From, op.FromSlot, op.To, op.ToSlot, err))
	}
	parent.Complete(pi, err) // may submit more copies (write-through)
	if req != nil {
		req.pendingLoads--
		req.landed++
		e.advance(req)
	}
}

// AddLayers implements kvtier.Relay.
func (r *relay) AddLayers(ly kvtier.Layers) { r.parent.AddLayers(ly) }
