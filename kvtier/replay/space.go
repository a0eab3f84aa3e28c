package replay

import (
	"errors"
	"math"

	"kvtier.dev/internal/invariants"
	"kvtier.dev/kvtier"
)

// Waiting for GPU slots. A request's insert (InsertKeys of all its blocks)
// can find too few GPU slots though the request was admitted (fits): the
// slots are held by blocks that copies still read (offloads, write-through
// copies) or, with write-back, by blocks whose demotion the insert has just
// started. The request then releases what it got and waits, holding its
// prefill slot, for an event: until the copies from the GPU and the leases
// released since have freed at least as many slots as it lacked, or until no
// copy of the GPU is left in flight (then its insert keeps what fits). Only
// then is its insert tried again: a waiting request is not walked, looked up
// or touched in the policies per copy completion. Its loads wait the same
// way, before it: those Onboard refused a GPU slot while copies read the
// GPU (kvtier.Lease.Refused) are submitted again after the event
// (RetryRefused), the loads it started going on meanwhile. The model
// server's engine waits for the same copies (kvtier.Manager.WaitCopiesFrom)
// at the same two points.

// noWake marks a waiting request that waits for the GPU's copies to end: it
// is larger than the GPU, so no count of freed slots makes it fit.
const noWake = math.MaxInt64

// insert reserves the request's blocks in the GPU and starts its prefill;
// without the slots, while copies of the GPU's may free some, it waits.
func (e *engine) insert(r *request) {
	err := e.m.InsertKeys(r.salt, r.keys, kvtier.GPU, r.l2)
	e.res.insertTries++
	if err != nil && !errors.Is(err, kvtier.ErrNoSpace) {
		invariants.Failf("replay: InsertKeys: %v", err) // only ErrNoSpace is possible on valid input
	}
	e.held(r) // its leases and segments grew
	// Copies of the GPU's may free slots.
	if err != nil && e.m.CopiesReading(kvtier.GPU) > 0 {
		e.wait(r)
		return
	}
	if err != nil {
		e.res.UncachedBlocks += int64(len(r.keys) - r.l2.Len())
	}
	r.inserted, r.passStart = true, e.now
	e.advance(r)
}

// wait releases the partial insert of r and queues r for the slots it
// lacked: those of its blocks, from the one the insert stopped at, that the
// GPU does not hold (Peek: no side effect).
func (e *engine) wait(r *request) {
	if !r.waited {
		r.waited = true
		e.res.SpaceWaits++
	}
	stop := r.l2.Len() // InsertKeys leases blocks in order, up to the one it found no slot for
	e.release(r.l2)
	r.wakeAt = noWake
	if int64(len(r.keys)) <= e.gpuSlots {
		lacked := int64(0)
		for _, k := range r.keys[stop:] {
			if b, ok := e.m.Peek(r.salt, k); !ok || !b.Held[kvtier.GPU] {
				lacked++
			}
		}
		r.wakeAt = e.gpuFreed + max(1, lacked)
	}
	e.waiting = append(e.waiting, r)
	e.wake = min(e.wake, r.wakeAt)
}

// waitForLoads queues r, whose Onboard found no GPU slot for n of its
// loads, for as many slots: it keeps its lease and the loads it started,
// and on waking submits the refused ones again (onboard).
func (e *engine) waitForLoads(r *request, n int) {
	if !r.waited {
		r.waited = true
		e.res.SpaceWaits++
	}
	r.waitLoads = true
	r.wakeAt = e.gpuFreed + int64(n)
	e.waiting = append(e.waiting, r)
	e.wake = min(e.wake, r.wakeAt)
}

// release releases l, counting its blocks among those that may have freed
// GPU slots (a block held elsewhere only makes the wait end sooner).
func (e *engine) release(l *kvtier.Lease) {
	e.gpuFreed += int64(l.Len())
	e.m.Release(l)
}

// copiedFromGPU counts a copy out of the GPU that ended (or was dropped):
// its block's slot may be free or evictable now.
func (e *engine) copiedFromGPU(op *kvtier.MoveOp) {
	if op.From == kvtier.GPU {
		e.gpuFreed++
	}
}

// slotsMayFit reports whether a waiting request's event came: enough slots
// freed for one of them, or no copy of the GPU's left in flight.
func (e *engine) slotsMayFit() bool {
	return len(e.waiting) > 0 && (e.gpuFreed >= e.wake || e.m.CopiesReading(kvtier.GPU) == 0)
}

// retryWaiting tries again, in arrival order, the inserts of the waiting
// requests whose event came; the others wait on.
func (e *engine) retryWaiting() {
	w := e.waiting
	e.waiting, e.retry = e.retry[:0], w
	e.wake = noWake
	copies := e.m.CopiesReading(kvtier.GPU)
	for i, r := range w {
		w[i] = nil
		if e.gpuFreed < r.wakeAt && copies > 0 {
			e.waiting = append(e.waiting, r)
			e.wake = min(e.wake, r.wakeAt)
			continue
		}
		if r.waitLoads {
			r.waitLoads = false
			r.l1.RetryRefused()
			e.onboard(r) // back onto e.waiting if still short
			continue
		}
		e.insert(r) // back onto e.waiting if still short
	}
}
