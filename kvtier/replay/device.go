package replay

import (
	"errors"
	"fmt"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/devmover"
	"kvtier.dev/kvtier/transfer"
)

// With Config.Mover "device" the copies between the GPU and the host tier
// are made by the code that serves: devmover.Mover over a
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
// in a replay of the bundled trace. A load from NVMe into the GPU is read
// by the modelled drive, then copied to the GPU by the device from one of
// stagingSlots host slots past the host tier's, as the DeviceMover's staged
// onboard does: so it queues behind the host loads on the GPU's ingress.
// One staged copy runs at a time, as the engine's staged onboards do; the
// blocks read meanwhile go together in the next Submit.

// devicePath is the replay's simulated device and the serving stack on it.
type devicePath struct {
	sim    *cudastream.Sim
	eng    *transfer.Engine
	mv     *devmover.Mover
	region cudastream.DevicePtr
	pool   []byte // unbacked; the sim's registrations are in chunks of regBytes
	regs   [][]byte

	// upAt is when the device's start-up work (the codec ring's probe of
	// its copy kernel, transfer.New) ends on its clock: a request of the
	// trace's first moments is submitted then, not before.
	upAt time.Duration

	inFlight int   // ops handed to mv and not completed
	err      error // the first op that failed: a replay's copies never fail
	free     []*relay

	// staging holds the free staging slots (host slots from hostSlots on);
	// waiting, from waitHead, the NVMe reads done that wait for one.
	staging  []kvtier.Slot
	waiting  []copyJob
	waitHead int

	// ready holds, per batch, the blocks the drive has read while a
	// staged copy was in flight (stagedOut of them, one at a time as the
	// engine's staged onboards run); they go to the GPU together when it
	// completes, several blocks to a Submit as the DeviceMover's staging
	// buffers carry them, not one Submit per block read.
	ready     []*relay
	stagedOut int

	// busyToGPU and busyFromGPU are the time the device's copy engines
	// spent copying, per direction (latencies included), set by close.
	busyToGPU, busyFromGPU time.Duration
}

// devicePathStats are the counts of a device path's mover and engine.
type devicePathStats struct {
	mover         devmover.Stats
	engine        transfer.Stats
	registrations int // of the host pool with the simulated device
}

// stagingSlots is how many loads from NVMe may cross the device's ingress
// at once (each holds a staging slot from the drive's read until its copy
// to the GPU is done); more wait for a slot. The slots are unbacked, so 64
// cost nothing, and the drive is slower than the ingress: they are rarely
// all taken.
const stagingSlots = 64

// newDevicePath builds the device for e's GPU and host tiers: hostSlots
// slots of e.blockBytes in the pool (none without a host tier), then the
// staging slots.
func newDevicePath(e *engine, hostSlots int64) (*devicePath, error) {
	// The links are the cost model's, as its Planner prices a pass's
	// loads: the host link's bandwidth both ways, its latency per copy
	// call, its descriptor and event costs; the copy kernel's launch is
	// the H200's (cudastream.H200Link).
	link := cudastream.LinkModel{
		HtoDBytesPerSec: e.hostLink.BandwidthBytesPerS, DtoHBytesPerSec: e.hostLink.BandwidthBytesPerS,
		CopyLatency: e.hostLink.Latency, DescriptorCost: e.hostLink.DescriptorCost, EventCost: e.hostLink.EventCost,
		KernelLaunch: cudastream.H200Link().KernelLaunch,
	}
	layers, parts := e.model.Layers, 2
	if e.model.IsMLA() {
		parts = 1
	}
	if layers < 1 || e.blockBytes%int64(layers*parts) != 0 {
		return nil, cfgErr("mover", "device: a block of %d bytes does not split into %d layers of %d parts", e.blockBytes, layers, parts)
	}
	gpuBytes := e.gpuSlots * e.blockBytes
	// MemoryBytes leaves room for the sim's rounding of the one allocation,
	// and for the codec's scratch.
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: gpuBytes + 256 + e.codecScratchBytes(), TimingOnly: true, Link: link, Clock: cudastream.SimVirtualClock})
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
	for s := range stagingSlots {
		d.staging = append(d.staging, kvtier.Slot(hostSlots)+kvtier.Slot(stagingSlots-1-s))
	}
	poolBytes := (hostSlots + stagingSlots) * e.stored
	if d.pool, err = unbacked(poolBytes); err != nil {
		return err
	}
	regBytes := max(1, maxRegistration/e.stored) * e.stored
	for off := int64(0); off < poolBytes; off += regBytes {
		r := d.pool[off:min(poolBytes, off+regBytes)]
		if err := d.sim.HostRegister(r); err != nil {
			return fmt.Errorf("replay: mover device: register the host pool: %w", err)
		}
		d.regs = append(d.regs, r)
	}
	host := transfer.HostLayout{Pool: d.pool, SlotBytes: e.stored, RegistrationBytes: regBytes}
	ec := transfer.Config{GPU: gpu, Host: host, Polled: true, Now: d.sim.Clock().Now}
	e.deviceCodec(&ec)
	if d.eng, err = transfer.New(d.sim, ec); err != nil {
		return fmt.Errorf("replay: mover device: %w", err)
	}
	if d.mv, err = devmover.New(devmover.Config{Engine: d.eng, Host: host, BlockBytes: e.stored, Codec: ec.Codec}); err != nil {
		return fmt.Errorf("replay: mover device: %w", err)
	}
	d.upAt = d.sim.Clock().Now()
	return nil
}

// eventTime is when the device work ev captured completes, if known (a
// layer event of the mover's, kvtier.Layers).
func (d *devicePath) eventTime(ev kvtier.Event) (time.Duration, bool) {
	ce, ok := ev.(cudastream.Event)
	if !ok {
		return 0, false
	}
	return d.sim.EventTime(ce)
}

// next is the device's next event, if it has work.
func (d *devicePath) next() (time.Duration, bool) { return d.sim.NextEvent() }

// advance moves the device's clock to at and completes what it finished.
func (d *devicePath) advance(at time.Duration) error {
	if err := d.setClock(at); err != nil {
		return err
	}
	d.eng.Poll()
	return d.err
}

// setClock moves the device's clock to at, so that what the replay submits
// then starts then (no sooner than the device is ready).
func (d *devicePath) setClock(at time.Duration) error {
	if err := d.sim.AdvanceTo(max(at, d.upAt)); err != nil {
		return fmt.Errorf("replay: mover device: %w", err)
	}
	return nil
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
	e       *engine
	parent  *kvtier.Batch
	b       *kvtier.Batch
	ops     []kvtier.MoveOp
	idx     []int
	req     []*request
	staging []kvtier.Slot // per op: the staging slot it copies from, or noStaging
	left    int
	staged  bool // a staged copy of blocks read from NVMe (devicePath.ready)
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

// noStaging marks a relayed op that copies from no staging slot.
const noStaging = ^kvtier.Slot(0)

func (r *relay) add(i int, req *request) { r.addOp(i, r.parent.Ops[i], req, noStaging) }

// Wanted implements kvtier.Relay: relayed op k is the parent's op idx[k].
func (r *relay) Wanted(k int) bool { return r.parent.Wanted(r.idx[k]) }

// addOp adds op as the parent's op i, copying from staging slot st
// (noStaging: none).
func (r *relay) addOp(i int, op kvtier.MoveOp, req *request, st kvtier.Slot) {
	r.ops = append(r.ops, op)
	r.idx = append(r.idx, i)
	r.req = append(r.req, req)
	r.staging = append(r.staging, st)
}

// stage copies to the GPU a block the drive has read (j, from the parent's
// NVMe to GPU op), from a staging slot; without a free one it waits, still
// in flight, for the next to be freed. With a staged copy in flight the
// block waits in d.ready for it to complete (flushStaged).
func (d *devicePath) stage(e *engine, j copyJob) {
	n := len(d.staging)
	if n == 0 {
		d.waiting = append(d.waiting, j)
		e.inFlight++
		return
	}
	st := d.staging[n-1]
	d.staging = d.staging[:n-1]
	op := j.t.Ops[j.op]
	op.From, op.FromSlot = kvtier.Host, st
	var rl *relay
	for _, r := range d.ready {
		if r.parent == j.t {
			rl = r
			break
		}
	}
	if rl == nil {
		rl = d.relayFor(e, j.t)
		rl.staged = true
		d.ready = append(d.ready, rl)
	}
	rl.addOp(j.op, op, j.req, st)
	// Held until submitted: the replay's loop must not end with it.
	e.inFlight++
	if d.stagedOut == 0 {
		d.flushStaged(e)
	}
}

// flushStaged submits the blocks read and waiting for a staged copy, a
// Submit per batch.
func (d *devicePath) flushStaged(e *engine) {
	for k, rl := range d.ready {
		d.ready[k] = nil
		e.inFlight -= len(rl.ops)
		d.stagedOut++
		d.submit(rl)
	}
	d.ready = d.ready[:0]
}

// unstage frees staging slot st and gives it to the first read waiting.
func (d *devicePath) unstage(e *engine, st kvtier.Slot) {
	d.staging = append(d.staging, st)
	if d.waitHead == len(d.waiting) {
		return
	}
	j := d.waiting[d.waitHead]
	d.waiting[d.waitHead] = copyJob{}
	if d.waitHead++; d.waitHead == len(d.waiting) {
		d.waiting, d.waitHead = d.waiting[:0], 0
	}
	e.inFlight--
	d.stage(e, j)
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
	parent, pi, req, op, st := r.parent, r.idx[i], r.req[i], r.ops[i], r.staging[i]
	r.left--
	lastStaged := r.left == 0 && r.staged
	if r.left == 0 { // nothing of r is read after this: it may serve the next Submit
		r.parent, r.b, r.staged = nil, nil, false
		r.ops, r.idx, r.req, r.staging = r.ops[:0], r.idx[:0], r.req[:0], r.staging[:0]
		clear(r.req[:cap(r.req)])
		d.free = append(d.free, r)
	}
	d.inFlight--
	e.inFlight--
	if st != noStaging {
		d.unstage(e, st)
	}
	if lastStaged {
		if d.stagedOut--; d.stagedOut == 0 {
			d.flushStaged(e)
		}
	}
	if err != nil {
		d.fail(fmt.Errorf("replay: mover device: %v slot %d to %v slot %d: %w", op.From, op.FromSlot, op.To, op.ToSlot, err))
	}
	e.copiedFromGPU(&op)
	parent.Complete(pi, err) // may submit more copies (write-through)
	if req != nil {
		req.pendingLoads--
		req.landed++
		e.advance(req)
	}
}

// AddLayers implements kvtier.Relay.
func (r *relay) AddLayers(ly kvtier.Layers) { r.parent.AddLayers(ly) }
