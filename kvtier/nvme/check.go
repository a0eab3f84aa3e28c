package nvme

import "kvtier.dev/internal/invariants"

// checkLocked verifies the slot table, the free lists and the key index
// against each other. It costs O(slots), so it runs only in builds with the
// invariants tag, and on large stores only on every 1024th call.
func (s *Store) checkLocked() {
	if !invariants.Enabled {
		return
	}
	s.checks++
	if len(s.slots) > 4096 && s.checks%1024 != 0 {
		return
	}
	listed := 0
	for fi, st := range s.free {
		for _, idx := range st {
			slot := Slot(fi*s.geom.slotsPerFile + int(idx))
			if !(s.slots[slot].state == stFree) {
				invariants.Failf("slot %d is on a free list in state %d", slot, s.slots[slot].state)
			}
		}
		listed += len(st)
	}
	free := 0
	for i := range s.slots {
		si := &s.slots[i]
		if si.state == stFree {
			free++
			if !(si.busy == 0) {
				invariants.Failf("free slot %d has busy = %d", i, si.busy)
			}
		}
		if si.state == stReadable {
			_, ok := s.index[si.key]
			if !(ok) {
				invariants.Failf("readable slot %d: key %#x not indexed", i, si.key)
			}
		}
	}
	if !(free == listed && free == s.nfree) {
		invariants.Failf("%d free slots, %d on free lists, nfree = %d", free, listed, s.nfree)
	}
	for key, slot := range s.index {
		si := &s.slots[slot]
		if !(si.state == stReadable && si.key == key) {
			invariants.Failf("index maps key %#x to slot %d in state %d with key %#x", key, slot, si.state, si.key)
		}
	}
}
