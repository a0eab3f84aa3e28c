package kvtier

import (
	"fmt"

	"kvtier.dev/internal/invariants"
)

// What adapters, tools and tests may read of the manager's state, through
// public types only: a block's residency, the keys a lease looked up, a
// tier's slot size, and a full consistency walk.

// BlockInfo is what Peek and Range report of one block.
type BlockInfo struct {
	Key, Parent Key
	Salt        Salt
	Position    int // the block's index in its request
	// Held[t]: the block holds slot Slot[t] of tier t (ready, or being
	// written or evicted); Ready[t]: its copy there is readable.
	Held, Ready [NumTiers]bool
	Slot        [NumTiers]Slot
}

func (r *record) info() BlockInfo {
	b := BlockInfo{Key: r.key, Parent: r.parent, Salt: r.salt, Position: int(r.depth)}
	for t := range NumTiers {
		if r.state[t] != stateNone {
			b.Held[t], b.Ready[t], b.Slot[t] = true, r.state[t] == stateReady, r.slot[t]
		}
	}
	return b
}

// Peek reports the block salt and key name, if known, with no side effect
// (no lease, policy touch or admission record).
func (m *Manager) Peek(salt Salt, key Key) (BlockInfo, bool) {
	st := &m.stripes[0]
	m.rlock(st)
	defer m.runlock(st)
	idx, ok := m.index.find(salt, key)
	if !ok {
		return BlockInfo{}, false
	}
	r := m.recs.at(BlockRef(idx))
	if r.flags&flagInvalid != 0 {
		return BlockInfo{}, false
	}
	return r.info(), true
}

// Range calls fn for every block the manager knows, in no order, until fn
// returns false, under the read lock: fn MUST NOT call the Manager.
func (m *Manager) Range(fn func(BlockInfo) bool) {
	st := &m.stripes[0]
	m.rlock(st)
	defer m.runlock(st)
	free := make(map[BlockRef]bool, len(m.recs.free))
	for _, f := range m.recs.free {
		free[f] = true
	}
	for ref := BlockRef(0); ref < BlockRef(m.recs.n); ref++ {
		r := m.recs.at(ref)
		if free[ref] || r.flags&flagInvalid != 0 {
			continue
		}
		if !fn(r.info()) {
			return
		}
	}
}

// SlotBytes is tier t's slot size (0 for an absent tier).
func (m *Manager) SlotBytes(t Tier) int64 {
	if t >= NumTiers || !m.tiers[t].present {
		return 0
	}
	return m.tiers[t].slotBytes
}

// LeasedKeys returns the keys of every full block of the request l looked
// up (found in the cache or not), when l holds a Lookup or LookupKeys by
// m. The slice is l's: read only, valid until l is released.
func (m *Manager) LeasedKeys(l *Lease) ([]Key, bool) {
	if !l.leased || l.m != m || !l.lookup {
		return nil, false
	}
	return l.keys, true
}

// ReadySlot reports leased block i's slot in tier t, if its copy there is
// ready: the slot stays the block's until l is released.
func (m *Manager) ReadySlot(l *Lease, i int, t Tier) (Slot, bool) {
	if !l.leased || l.m != m || i < 0 || i >= len(l.Blocks) || t >= NumTiers {
		return 0, false
	}
	st := m.stripeOf(l)
	m.rlock(st)
	rec := m.recs.at(l.Blocks[i].Ref)
	s, ok := rec.slot[t], rec.state[t] == stateReady
	m.runlock(st)
	return s, ok
}

// Verify walks every record, slot, index entry and policy and returns an
// error naming the first inconsistency. O(blocks) under the write lock: for
// tests and debugging.
func (m *Manager) Verify() (err error) {
	m.lock()
	defer m.unlock()
	defer func() {
		if v := recover(); v != nil {
			b, ok := v.(*invariants.Broken)
			if !ok {
				panic(v)
			}
			err = fmt.Errorf("kvtier: Verify: %w", b)
		}
	}()
	m.checkInvariants()
	return nil
}
