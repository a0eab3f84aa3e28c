package replay

import (
	"fmt"

	"kvtier.dev/internal/invariants"
	"kvtier.dev/kvtier"
)

// check verifies the engine's bookkeeping after an event. It walks the
// channels and reads the manager's counters, so it runs only with the
// invariants build tag.
func (e *engine) check() {
	queued := 0
	for ch := range numChannels {
		s := &e.servers[ch]
		for p := range numPriorities {
			queued += s.queue[p].ops()
		}
		if s.busy {
			queued += e.serving[ch].ops()
		}
		invariants.Check(s.busy == (e.serving[ch].t != nil), "channel %s busy %v serving %v", channelNames[ch], s.busy, e.serving[ch].t != nil)
	}
	if d := e.dev; d != nil {
		queued += d.inFlight + len(d.waiting) - d.waitHead
		for _, r := range d.ready {
			queued += len(r.ops)
		}
		invariants.Check(len(d.waiting) == d.waitHead || len(d.staging) == 0,
			"%d staging slots free while %d reads wait for one", len(d.staging), len(d.waiting)-d.waitHead)
	}
	invariants.Check(queued == e.inFlight, "%d copies queued or crossing, %d in flight", queued, e.inFlight)
	invariants.Check(e.gpuHeld >= 0 && e.inPrefill >= 0 && e.computeRunning >= 0, "negative count: held %d, prefilling %d, computing %d",
		e.gpuHeld, e.inPrefill, e.computeRunning)
	invariants.Check(e.cfg.PrefillSlots == 0 || e.inPrefill <= e.cfg.PrefillSlots, "%d prefilling, %d slots", e.inPrefill, e.cfg.PrefillSlots)
	invariants.Check(!e.inRound || e.inPrefill == 0, "a decode round and %d prefills on the GPU at once", e.inPrefill)
	invariants.Check(e.cfg.DecodeOnGPU || (len(e.decoding) == 0 && !e.inRound), "decode rounds without decode_on_gpu")
	invariants.Check(len(e.decoding) <= e.cfg.maxBatch(), "%d decoding, max batch %d", len(e.decoding), e.cfg.maxBatch())
	if e.m != nil {
		mt := e.m.Metrics()
		for t := range kvtier.NumTiers {
			tm := mt.Tiers[t]
			invariants.Check(tm.ResidentBlocks <= tm.CapacitySlots, "tier %v holds %d blocks in %d slots", t, tm.ResidentBlocks, tm.CapacitySlots)
		}
	}
}

// checkEnd verifies that a finished replay left nothing behind: no copy,
// request or reference.
func (e *engine) checkEnd() error {
	if e.inFlight != 0 || len(e.waiting) != 0 || e.computeRunning != 0 || e.inPrefill != 0 ||
		e.admitHead != len(e.admitQueue) || e.gpuHeld != 0 || len(e.decoding) != 0 || e.inRound {
		return fmt.Errorf("replay: internal error: ended with %d copies, %d requests waiting for space, %d prefills, "+
			"%d prefilling, %d queued, %d GPU blocks held, %d decoding (round running: %v)", e.inFlight, len(e.waiting),
			e.computeRunning, e.inPrefill, len(e.admitQueue)-e.admitHead, e.gpuHeld, len(e.decoding), e.inRound)
	}
	if e.m != nil {
		for t, tm := range e.m.Metrics().Tiers {
			if tm.InUseBlocks != 0 {
				return fmt.Errorf("replay: internal error: %d blocks of tier %v still in use at the end", tm.InUseBlocks, kvtier.Tier(t))
			}
		}
	}
	return nil
}
