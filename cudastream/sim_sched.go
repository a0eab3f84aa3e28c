package cudastream

import (
	"fmt"
	"math"
	"time"

	"kvtier.dev/internal/invariants"
)

// The sim's scheduler: a discrete-event simulation of streams and copy
// engines (the model is described at the top of sim.go). Everything here runs
// with Sim.mu held.

const simForever = time.Duration(math.MaxInt64)

type simOpKind uint8

const (
	simOpCopy   simOpKind = iota
	simOpRecord           // completes a marker
	simOpWait             // waits for a marker
)

// simSpan is one resolved piece of a copy. dst or src is nil when the side
// is unbacked (TimingOnly device memory); then no bytes move.
type simSpan struct {
	dst, src         []byte
	dstMem, srcMem   *simAlloc
	dstHost, srcHost *simHostRange
}

// moves reports whether sp moves bytes (both sides backed).
func (sp *simSpan) moves() bool { return sp.dst != nil && sp.src != nil }

// joins reports whether next, after sp in one op, may be tracked by sp:
// neither moves bytes and both touch the same memory.
func (sp *simSpan) joins(next *simSpan) bool {
	return !sp.moves() && !next.moves() && sp.dstMem == next.dstMem && sp.srcMem == next.srcMem &&
		sp.dstHost == next.dstHost && sp.srcHost == next.srcHost
}

func (sp *simSpan) freed() bool {
	return (sp.dstMem != nil && sp.dstMem.freed) || (sp.srcMem != nil && sp.srcMem.freed) ||
		(sp.dstHost != nil && sp.dstHost.gone) || (sp.srcHost != nil && sp.srcHost.gone)
}

func (sp *simSpan) touches(al *simAlloc, hr *simHostRange) bool {
	return (al != nil && (sp.dstMem == al || sp.srcMem == al)) ||
		(hr != nil && (sp.dstHost == hr || sp.srcHost == hr))
}

func (sp *simSpan) track(delta int) {
	if sp.dstMem != nil {
		sp.dstMem.inflight += delta
	}
	if sp.srcMem != nil {
		sp.srcMem.inflight += delta
	}
	if sp.dstHost != nil {
		sp.dstHost.inflight += delta
	}
	if sp.srcHost != nil {
		sp.srcHost.inflight += delta
	}
}

// simOp is one operation on a stream. Ops are pooled: no allocation per copy
// once the pool and the span slices have grown.
type simOp struct {
	kind      simOpKind
	dir       CopyKind
	call      string
	seq       uint64
	enq       time.Duration // enqueue time
	cost      time.Duration
	start     time.Duration // valid once scheduled
	end       time.Duration
	scheduled bool
	marker    *simMarker // record: the marker it completes; wait: the one it waits for
	spans     []simSpan
	bytes     int64        // copies: total bytes
	sum       *simSums     // WordSums: the work to do at completion (spans only track its memory)
	goKernel  *simGoKernel // LaunchGo: likewise
}

// simMarker is the completion state of one event record. It is shared by the
// event, the record op and any wait ops, and returns to the pool when the
// last of them lets go.
type simMarker struct {
	known     bool          // time is fixed
	time      time.Duration // modelled completion time
	done      bool          // retired: the captured work has completed
	faultCode int
	fault     string
	refs      int
}

func (s *Sim) newOp(kind simOpKind, call string) *simOp {
	var op *simOp
	if n := len(s.opPool); n > 0 {
		op = s.opPool[n-1]
		s.opPool[n-1] = nil
		s.opPool = s.opPool[:n-1]
	} else {
		op = new(simOp)
	}
	spans := op.spans[:0]
	*op = simOp{kind: kind, call: call, spans: spans}
	return op
}

func (s *Sim) putOp(op *simOp) {
	clear(op.spans) // drop references to memory
	op.sum = nil
	op.goKernel = nil
	op.spans = op.spans[:0]
	if op.marker != nil {
		s.releaseMarker(op.marker)
		op.marker = nil
	}
	s.opPool = append(s.opPool, op)
}

func (s *Sim) newMarker() *simMarker {
	if n := len(s.markerPool); n > 0 {
		m := s.markerPool[n-1]
		s.markerPool[n-1] = nil
		s.markerPool = s.markerPool[:n-1]
		*m = simMarker{}
		return m
	}
	return new(simMarker)
}

func (s *Sim) releaseMarker(m *simMarker) {
	m.refs--
	if m.refs < 0 {
		invariants.Failf("marker released more often than held")
	}
	if m.refs == 0 {
		s.markerPool = append(s.markerPool, m)
	}
}

// enqueue appends op to st's queue at the current time.
func (s *Sim) enqueue(st *simStream, op *simOp) {
	s.seq++
	op.seq = s.seq
	op.enq = s.nowLocked()
	for i := range op.spans {
		op.spans[i].track(+1)
	}
	st.push(op)
	if !s.virtual {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// nextDecision finds the stream whose first unscheduled op starts soonest,
// at a time <= limit: the earliest start, then the higher priority, then the
// earlier enqueue.
func (s *Sim) nextDecision(limit time.Duration) (best *simStream, bestT time.Duration) {
	var bestOp *simOp
	for _, st := range s.streams {
		op := st.firstUnscheduled()
		if op == nil {
			continue
		}
		t := max(op.enq, st.lastEnd)
		if op.kind == simOpWait {
			if !op.marker.known {
				continue
			}
			t = max(t, op.marker.time)
		}
		if op.kind == simOpCopy {
			t = max(t, s.engines[op.dir][s.freeEngine(op.dir)])
		}
		if t > limit {
			continue
		}
		if best == nil || t < bestT ||
			(t == bestT && (st.prio < best.prio || (st.prio == best.prio && op.seq < bestOp.seq))) {
			best, bestT, bestOp = st, t, op
		}
	}
	return best, bestT
}

// freeEngine is the engine of direction k that frees first.
func (s *Sim) freeEngine(k CopyKind) int {
	e := s.engines[k]
	j := 0
	for i := 1; i < len(e); i++ {
		if e[i] < e[j] {
			j = i
		}
	}
	return j
}

// scheduleNext fixes the start of the next operation that starts by limit.
func (s *Sim) scheduleNext(limit time.Duration) bool {
	st, t := s.nextDecision(limit)
	if st == nil {
		return false
	}
	op := st.firstUnscheduled()
	op.start = t
	op.end = t + op.cost
	op.scheduled = true
	if op.kind == simOpCopy {
		s.engines[op.dir][s.freeEngine(op.dir)] = op.end
		s.stats.Copies[op.dir]++
		s.stats.Bytes[op.dir] += op.bytes
		s.stats.Busy[op.dir] += op.cost
	}
	st.lastEnd = op.end
	st.nsched++
	if op.kind == simOpRecord {
		op.marker.known = true
		op.marker.time = op.end
	}
	return true
}

// scheduleOp schedules ahead (past the clock) until op's times are fixed.
// The caller then moves the virtual clock to op.end. Every queued op can be
// scheduled: the unscheduled op enqueued first depends only on earlier ones.
func (s *Sim) scheduleOp(op *simOp) {
	for !op.scheduled {
		if !s.scheduleNext(simForever) {
			invariants.Failf("no operation can be scheduled while op %d waits", op.seq)
		}
	}
}

// scheduleMarker is scheduleOp for the record op behind m.
func (s *Sim) scheduleMarker(m *simMarker) {
	for !m.known {
		if !s.scheduleNext(simForever) {
			invariants.Failf("no operation can be scheduled while a marker waits")
		}
	}
}

// advanceLocked fixes every start at or before h and retires every
// operation that ends at or before h, in order of end time, then enqueue.
func (s *Sim) advanceLocked(h time.Duration) {
	for s.scheduleNext(h) {
	}
	retired := false
	for {
		var best *simStream
		var bestOp *simOp
		for _, st := range s.streams {
			if st.nsched == 0 {
				continue
			}
			op := st.q[st.head]
			if op.end > h {
				continue
			}
			if best == nil || op.end < bestOp.end || (op.end == bestOp.end && op.seq < bestOp.seq) {
				best, bestOp = st, op
			}
		}
		if best == nil {
			break
		}
		best.pop()
		best.nsched--
		s.finish(best, bestOp)
		retired = true
	}
	if retired {
		s.dropDestroyedStreams()
		s.cond.Broadcast()
	}
	if invariants.Enabled {
		s.checkInvariants()
	}
}

// finish retires op: the data moves, markers complete.
func (s *Sim) finish(st *simStream, op *simOp) {
	switch op.kind {
	case simOpCopy:
		for i := range op.spans {
			op.spans[i].track(-1)
		}
		if st.faultCode == 0 {
			for i := range op.spans {
				if op.spans[i].freed() {
					st.setFault(cudaErrorIllegalAddress, fmt.Sprintf("%s (op %d) touched memory freed while it was queued", op.call, op.seq))
					break
				}
			}
		}
		if st.faultCode == 0 {
			for i := range op.spans {
				sp := &op.spans[i]
				if sp.moves() {
					copy(sp.dst, sp.src)
				}
			}
			if op.sum != nil {
				op.sum.run(s, st)
			}
			if op.goKernel != nil {
				op.goKernel.runOn(st)
			}
		}
	case simOpRecord:
		op.marker.done = true
		if st.faultCode != 0 {
			op.marker.faultCode, op.marker.fault = st.faultCode, st.fault
		}
	case simOpWait:
		if op.marker.faultCode != 0 {
			st.setFault(op.marker.faultCode, op.marker.fault)
		}
	}
	s.putOp(op)
}

// nextEventLocked is the next time the timeline changes on its own: a
// pending start or end after the last advance.
func (s *Sim) nextEventLocked() (time.Duration, bool) {
	next, ok := simForever, false
	if st, t := s.nextDecision(simForever); st != nil {
		next, ok = t, true
	}
	for _, st := range s.streams {
		if st.nsched > 0 && st.q[st.head].end < next {
			next, ok = st.q[st.head].end, true
		}
	}
	return next, ok
}

// faultQueued faults every stream with a queued copy touching al or hr.
func (s *Sim) faultQueued(al *simAlloc, hr *simHostRange, why string) {
	for _, st := range s.streams {
		for _, op := range st.q[st.head:] {
			for i := range op.spans {
				if op.spans[i].touches(al, hr) {
					st.setFault(cudaErrorIllegalAddress, fmt.Sprintf("%s (op %d, %s)", why, op.seq, op.call))
					break
				}
			}
		}
	}
}

func (s *Sim) dropDestroyedStreams() {
	kept := s.streams[:0]
	for _, st := range s.streams {
		if !st.destroyed || st.pending() > 0 {
			kept = append(kept, st)
		}
	}
	clear(s.streams[len(kept):])
	s.streams = kept
}

// checkInvariants scans every queue (build tag invariants). Checks are
// written as "if !ok { simPanic }" so that they box nothing when they pass.
func (s *Sim) checkInvariants() {
	for _, st := range s.streams {
		if st.nsched > st.pending() {
			invariants.Failf("stream %d: %d scheduled of %d pending", st.id, st.nsched, st.pending())
		}
		prev := time.Duration(math.MinInt64)
		for i, op := range st.q[st.head:] {
			if op.scheduled != (i < st.nsched) {
				invariants.Failf("stream %d: op %d scheduled=%v at queue position %d (nsched %d)", st.id, op.seq, op.scheduled, i, st.nsched)
			}
			if op.scheduled {
				if op.start < op.enq || op.end < op.start || op.start < prev {
					invariants.Failf("stream %d: op %d times enq %v start %v end %v after %v", st.id, op.seq, op.enq, op.start, op.end, prev)
				}
				prev = op.end
			}
		}
	}
	var used int64
	for _, al := range s.mem.allocs {
		if !al.freed {
			used += al.rounded
		}
	}
	if used != s.mem.used {
		invariants.Failf("device memory in use %d, accounted %d", used, s.mem.used)
	}
}
