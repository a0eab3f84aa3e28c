package cudastream

import (
	"fmt"
	"time"
)

// simStream is a stream of the sim: a FIFO of operations, the first nsched
// of which have their times fixed.
type simStream struct {
	sim       *Sim
	id        int
	prio      int
	q         []*simOp // live ops are q[head:]
	head      int
	nsched    int
	lastEnd   time.Duration // end of the last scheduled op
	faultCode int           // sticky error, 0 if none
	fault     string
	destroyed bool
	rows      []Copy // Copy2D's rows, reused (under sim.mu)
}

var _ Stream = (*simStream)(nil)

func (st *simStream) pending() int { return len(st.q) - st.head }

func (st *simStream) firstUnscheduled() *simOp {
	if st.nsched == st.pending() {
		return nil
	}
	return st.q[st.head+st.nsched]
}

func (st *simStream) push(op *simOp) {
	if st.head > 0 && len(st.q) == cap(st.q) {
		n := copy(st.q, st.q[st.head:])
		clear(st.q[n:])
		st.q = st.q[:n]
		st.head = 0
	}
	st.q = append(st.q, op)
}

func (st *simStream) pop() {
	st.q[st.head] = nil
	st.head++
	if st.head == len(st.q) {
		st.q = st.q[:0]
		st.head = 0
	}
}

func (st *simStream) setFault(code int, why string) {
	if st.faultCode == 0 {
		st.faultCode, st.fault = code, why
	}
}

// check fails if the stream cannot take work. Called with sim.mu held.
func (st *simStream) check(call string) error {
	if err := st.sim.usable(call); err != nil {
		return err
	}
	if st.destroyed {
		return simError(call, cudaErrorInvalidValue, "stream %d was destroyed", st.id)
	}
	if st.faultCode != 0 {
		return simError(call, st.faultCode, "stream %d faulted earlier: %s", st.id, st.fault)
	}
	return nil
}

// NewStream creates a stream. Lower priority numbers go first when streams
// wait for the same copy engine; any int is accepted.
func (s *Sim) NewStream(priority int) (Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable("cuStreamCreateWithPriority"); err != nil {
		return nil, err
	}
	st := &simStream{sim: s, id: s.nextStreamID, prio: priority}
	s.nextStreamID++
	st.lastEnd = s.nowLocked()
	s.streams = append(s.streams, st)
	return st, nil
}

// CopyHtoD enqueues a copy of src to device memory at dst. src is pinned when
// it lies inside a registered range, pageable otherwise.
func (st *simStream) CopyHtoD(dst DevicePtr, src []byte) error {
	const call = "cuMemcpyHtoDAsync"
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := st.check(call); err != nil {
		return err
	}
	n := int64(len(src))
	op := s.newOp(simOpCopy, call)
	op.dir = HostToDevice
	pinned := false
	if n > 0 {
		al, off, err := s.mem.resolve(call, dst, n)
		if err != nil {
			s.putOp(op)
			return err
		}
		host := s.mem.findHost(HostAddr(src), n)
		pinned = host != nil
		sp := simSpan{src: src, dstMem: al, srcHost: host}
		if al.data != nil {
			sp.dst = al.data[off : off+n]
		}
		op.spans = append(op.spans, sp)
	}
	op.bytes = n
	op.cost = s.link.copyCost(HostToDevice, pinned, n, 0)
	s.enqueue(st, op)
	return nil
}

// CopyDtoH enqueues a copy of len(dst) bytes from device memory at src.
func (st *simStream) CopyDtoH(dst []byte, src DevicePtr) error {
	const call = "cuMemcpyDtoHAsync"
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := st.check(call); err != nil {
		return err
	}
	n := int64(len(dst))
	op := s.newOp(simOpCopy, call)
	op.dir = DeviceToHost
	pinned := false
	if n > 0 {
		al, off, err := s.mem.resolve(call, src, n)
		if err != nil {
			s.putOp(op)
			return err
		}
		host := s.mem.findHost(HostAddr(dst), n)
		pinned = host != nil
		sp := simSpan{dst: dst, srcMem: al, dstHost: host}
		if al.data != nil {
			sp.src = al.data[off : off+n]
		}
		op.spans = append(op.spans, sp)
	}
	op.bytes = n
	op.cost = s.link.copyCost(DeviceToHost, pinned, n, 0)
	s.enqueue(st, op)
	return nil
}

// CopyDtoD enqueues a device-to-device copy of n bytes.
func (st *simStream) CopyDtoD(dst, src DevicePtr, n int64) error {
	const call = "cuMemcpyDtoDAsync"
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := st.check(call); err != nil {
		return err
	}
	if n < 0 {
		return simError(call, cudaErrorInvalidValue, "negative size %d", n)
	}
	op := s.newOp(simOpCopy, call)
	op.dir = DeviceToDevice
	if n > 0 {
		sp, err := s.deviceSpan(call, dst, src, n)
		if err != nil {
			s.putOp(op)
			return err
		}
		op.spans = append(op.spans, sp)
	}
	op.bytes = n
	op.cost = s.link.copyCost(DeviceToDevice, true, n, 0)
	s.enqueue(st, op)
	return nil
}

func (s *Sim) deviceSpan(call string, dst, src DevicePtr, n int64) (simSpan, error) {
	da, doff, err := s.mem.resolve(call, dst, n)
	if err != nil {
		return simSpan{}, err
	}
	sa, soff, err := s.mem.resolve(call, src, n)
	if err != nil {
		return simSpan{}, err
	}
	sp := simSpan{dstMem: da, srcMem: sa}
	if da.data != nil && sa.data != nil {
		sp.dst = da.data[doff : doff+n]
		sp.src = sa.data[soff : soff+n]
	}
	return sp, nil
}

// CopyBatch enqueues ops as one operation that occupies the kind's engine
// for CopyLatency + len(ops)*DescriptorCost + total bytes/bandwidth. Host
// addresses MUST lie inside registered, HostAlloc'd or VMM host memory
// (ErrNotRegistered otherwise). Every descriptor is checked before anything
// is enqueued: on error nothing is. An empty ops enqueues nothing, as on the
// real device.
func (st *simStream) CopyBatch(kind CopyKind, ops []Copy) error {
	const call = "cuMemcpyBatchAsync"
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := st.check(call); err != nil {
		return err
	}
	if kind >= NumCopyKinds {
		return simError(call, cudaErrorInvalidValue, "copy kind %d", kind)
	}
	if len(ops) == 0 {
		return nil
	}
	return st.enqueueMany(call, kind, ops, simCostBatch)
}

var _ Copier2D = (*simStream)(nil)

// Copy2D enqueues the strided copy as one operation that costs one copy
// (CopyLatency + bytes/bandwidth: the engines walk the rows), with
// CopyBatch's checks for each row.
func (st *simStream) Copy2D(kind CopyKind, c Copy2D) error {
	const call = "cuMemcpy2DAsync"
	if err := checkCopy2D(kind, c); err != nil {
		return err
	}
	if c.Width == 0 || c.Height == 0 {
		return nil
	}
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := st.check(call); err != nil {
		return err
	}
	st.rows = st.rows[:0] // enqueueMany keeps spans, not the descriptors
	for i := range c.Height {
		st.rows = append(st.rows, Copy{Dst: c.Dst + uint64(i*c.DstPitch), Src: c.Src + uint64(i*c.SrcPitch), Bytes: c.Width})
	}
	return st.enqueueMany(call, kind, st.rows, simCostOne)
}

// How an operation of many descriptors is priced.
type simCost uint8

const (
	simCostBatch  simCost = iota // a batch: a cost per descriptor
	simCostKernel                // a copy kernel's launches
	simCostOne                   // one strided copy: one descriptor
)

// enqueueMany checks ops and enqueues them as one operation: a batch, a
// copy kernel's launches or the rows of a strided copy. Called with sim.mu
// held. A descriptor that moves no bytes (TimingOnly) joins the span of
// the one before it when both touch the same memory: the op then keeps a
// span per memory it touches, not per descriptor, as its completion only
// checks and counts that memory.
func (st *simStream) enqueueMany(call string, kind CopyKind, ops []Copy, cost simCost) error {
	s := st.sim
	op := s.newOp(simOpCopy, call)
	op.dir = kind
	var total int64
	descriptors := 0
	for i, c := range ops {
		sp, err := s.batchSpan(call, kind, c)
		if err != nil {
			s.putOp(op)
			return fmt.Errorf("descriptor %d of %d: %w", i, len(ops), err)
		}
		if c.Bytes > 0 {
			descriptors++
			if n := len(op.spans); n == 0 || !op.spans[n-1].joins(&sp) {
				op.spans = append(op.spans, sp)
			}
		}
		total += c.Bytes
	}
	if descriptors == 0 {
		// Only zero-sized descriptors: the device enqueues nothing.
		s.putOp(op)
		return nil
	}
	op.bytes = total
	switch cost {
	case simCostKernel:
		op.cost = s.link.kernelCost(kind, total)
	case simCostOne:
		op.cost = s.link.copyCost(kind, true, total, 0)
	default:
		op.cost = s.link.copyCost(kind, true, total, descriptors)
	}
	s.enqueue(st, op)
	return nil
}

func (s *Sim) batchSpan(call string, kind CopyKind, c Copy) (simSpan, error) {
	if c.Bytes < 0 {
		return simSpan{}, simError(call, cudaErrorInvalidValue, "negative size %d", c.Bytes)
	}
	if c.Bytes == 0 {
		return simSpan{}, nil
	}
	switch kind {
	case HostToDevice:
		al, off, err := s.mem.resolve(call, DevicePtr(c.Dst), c.Bytes)
		if err != nil {
			return simSpan{}, err
		}
		hr, src, err := s.mem.hostSlice(call, c.Src, c.Bytes)
		if err != nil {
			return simSpan{}, err
		}
		sp := simSpan{src: src, dstMem: al, srcHost: hr}
		if al.data != nil {
			sp.dst = al.data[off : off+c.Bytes]
		}
		return sp, nil
	case DeviceToHost:
		al, off, err := s.mem.resolve(call, DevicePtr(c.Src), c.Bytes)
		if err != nil {
			return simSpan{}, err
		}
		hr, dst, err := s.mem.hostSlice(call, c.Dst, c.Bytes)
		if err != nil {
			return simSpan{}, err
		}
		sp := simSpan{dst: dst, srcMem: al, dstHost: hr}
		if al.data != nil {
			sp.src = al.data[off : off+c.Bytes]
		}
		return sp, nil
	}
	return s.deviceSpan(call, DevicePtr(c.Dst), DevicePtr(c.Src), c.Bytes)
}

// WaitEvent makes later work on st wait for the work e captured. Waiting on
// an event never recorded does nothing, as in CUDA.
func (st *simStream) WaitEvent(e Event) error {
	const call = "cuStreamWaitEvent"
	s := st.sim
	ev, err := s.event(call, e)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := st.check(call); err != nil {
		return err
	}
	if err := ev.check(call); err != nil {
		return err
	}
	if ev.marker == nil {
		return nil
	}
	op := s.newOp(simOpWait, call)
	op.marker = ev.marker
	ev.marker.refs++
	s.enqueue(st, op)
	return nil
}

// Query reports whether all work enqueued on st has completed, or the
// stream's fault.
func (st *simStream) Query() (bool, error) {
	const call = "cuStreamQuery"
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(call); err != nil {
		return false, err
	}
	s.advanceLocked(s.nowLocked())
	if st.faultCode != 0 {
		return false, simError(call, st.faultCode, "stream %d: %s", st.id, st.fault)
	}
	return st.pending() == 0, nil
}

// Synchronize waits for all work enqueued on st so far. On the virtual clock
// it moves the clock to that work's end.
func (st *simStream) Synchronize() error {
	const call = "cuStreamSynchronize"
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(call); err != nil {
		return err
	}
	if st.pending() > 0 {
		last := st.q[len(st.q)-1]
		if s.virtual {
			s.scheduleOp(last)
			s.now = max(s.now, last.end)
			s.advanceLocked(s.now)
		} else {
			seq := last.seq
			for {
				s.advanceLocked(s.nowLocked())
				if st.faultCode != 0 || st.pending() == 0 || st.q[st.head].seq > seq {
					break
				}
				if err := s.usable(call); err != nil {
					return err
				}
				s.cond.Wait()
			}
		}
	}
	if st.faultCode != 0 {
		return simError(call, st.faultCode, "stream %d: %s", st.id, st.fault)
	}
	return nil
}

// Destroy releases the stream; work already enqueued still runs.
func (st *simStream) Destroy() error {
	const call = "cuStreamDestroy"
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.destroyed {
		return simError(call, cudaErrorInvalidValue, "stream %d already destroyed", st.id)
	}
	st.destroyed = true
	s.dropDestroyedStreams()
	return nil
}

// simEvent is an event of the sim: a pointer to the marker of its last
// record.
type simEvent struct {
	sim       *Sim
	timing    bool
	marker    *simMarker
	destroyed bool
}

var _ Event = (*simEvent)(nil)

// NewEvent creates an event.
func (s *Sim) NewEvent(opts EventOptions) (Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable("cuEventCreate"); err != nil {
		return nil, err
	}
	return &simEvent{sim: s, timing: opts.Timing}, nil
}

// event converts e, which must be an event of s.
func (s *Sim) event(call string, e Event) (*simEvent, error) {
	ev, ok := e.(*simEvent)
	if !ok || ev == nil || ev.sim != s {
		return nil, simError(call, cudaErrorInvalidValue, "event %T is not an event of this sim", e)
	}
	return ev, nil
}

func (ev *simEvent) check(call string) error {
	if err := ev.sim.usable(call); err != nil {
		return err
	}
	if ev.destroyed {
		return simError(call, cudaErrorInvalidValue, "event was destroyed")
	}
	return nil
}

// Record captures the work enqueued on s so far. The record itself occupies
// the stream for LinkModel.EventCost.
func (ev *simEvent) Record(s Stream) error {
	const call = "cuEventRecord"
	st, ok := s.(*simStream)
	if !ok || st == nil || st.sim != ev.sim {
		return simError(call, cudaErrorInvalidValue, "stream %T is not a stream of this sim", s)
	}
	sim := ev.sim
	sim.mu.Lock()
	defer sim.mu.Unlock()
	if err := ev.check(call); err != nil {
		return err
	}
	if err := st.check(call); err != nil {
		return err
	}
	m := sim.newMarker()
	m.refs = 2 // the event and the record op
	op := sim.newOp(simOpRecord, call)
	op.marker = m
	op.cost = sim.link.EventCost
	if ev.marker != nil {
		sim.releaseMarker(ev.marker)
	}
	ev.marker = m
	sim.enqueue(st, op)
	return nil
}

// Query reports whether the captured work has completed.
func (ev *simEvent) Query() (bool, error) {
	const call = "cuEventQuery"
	s := ev.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ev.check(call); err != nil {
		return false, err
	}
	s.advanceLocked(s.nowLocked())
	return ev.doneLocked(call)
}

func (ev *simEvent) doneLocked(call string) (bool, error) {
	m := ev.marker
	if m == nil {
		return true, nil
	}
	if m.faultCode != 0 {
		return false, simError(call, m.faultCode, "captured work faulted: %s", m.fault)
	}
	return m.done, nil
}

// Synchronize waits for the captured work. On the virtual clock it moves the
// clock to the work's completion time.
func (ev *simEvent) Synchronize() error {
	const call = "cuEventSynchronize"
	s := ev.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ev.check(call); err != nil {
		return err
	}
	m := ev.marker
	if m == nil {
		return nil
	}
	if s.virtual {
		s.scheduleMarker(m)
		s.now = max(s.now, m.time)
		s.advanceLocked(s.now)
	} else {
		for {
			s.advanceLocked(s.nowLocked())
			if m.done {
				break
			}
			if err := s.usable(call); err != nil {
				return err
			}
			s.cond.Wait()
		}
	}
	_, err := ev.doneLocked(call)
	return err
}

// Elapsed returns the modelled time from start's completion to ev's. Both
// must have been created with Timing, recorded and completed.
func (ev *simEvent) Elapsed(start Event) (time.Duration, error) {
	const call = "cuEventElapsedTime"
	s := ev.sim
	sv, err := s.event(call, start)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ev.check(call); err != nil {
		return 0, err
	}
	if err := sv.check(call); err != nil {
		return 0, err
	}
	if !ev.timing || !sv.timing {
		return 0, simError(call, cudaErrorInvalidValue, "both events need EventOptions.Timing (start %v, end %v)", sv.timing, ev.timing)
	}
	if ev.marker == nil || sv.marker == nil {
		return 0, simError(call, cudaErrorInvalidValue, "both events must be recorded")
	}
	s.advanceLocked(s.nowLocked())
	if !ev.marker.done || !sv.marker.done {
		return 0, simError(call, cudaErrorNotReady, "an event has not completed")
	}
	return ev.marker.time - sv.marker.time, nil
}

// Destroy releases the event.
func (ev *simEvent) Destroy() error {
	const call = "cuEventDestroy"
	s := ev.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if ev.destroyed {
		return simError(call, cudaErrorInvalidValue, "event already destroyed")
	}
	ev.destroyed = true
	if ev.marker != nil {
		s.releaseMarker(ev.marker)
		ev.marker = nil
	}
	return nil
}

var _ KernelCopier = (*simStream)(nil)

// CopyKernel enqueues ops as one operation, like CopyBatch, that costs
// LinkModel.KernelLaunch + total bytes/bandwidth: no per-descriptor cost.
// The checks are CopyBatch's (host memory MUST be registered, HostAlloc'd or
// VMM); an empty ops enqueues nothing, as on the real device.
func (st *simStream) CopyKernel(kind CopyKind, ops []Copy) error {
	const call = "cuLaunchKernel (kvtier_copy)"
	if err := checkCopyOps("CopyKernel", kind, ops); err != nil {
		return err
	}
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := st.check(call); err != nil {
		return err
	}
	if len(ops) == 0 {
		return nil
	}
	return st.enqueueMany(call, kind, ops, simCostKernel)
}

// SetKernelCopyOptions checks o as the real device does; the simulated
// kernel's cost does not depend on it.
func (st *simStream) SetKernelCopyOptions(o KernelCopyOptions) error {
	if _, err := o.withDefaults(); err != nil {
		return err
	}
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	return st.check("SetKernelCopyOptions")
}
