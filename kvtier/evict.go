package kvtier

import (
	"context"
	"fmt"

	"kvtier.dev/internal/invariants"
	"kvtier.dev/kvtier/policy"
)

// Evict moves the blocks of tokens' cached prefix (salt's) out of every tier
// faster than keep, copying into keep those it lacks; blocks in use keep
// their faster copies. It waits for its copies and returns how many it took
// out, or an error.
func (m *Manager) Evict(ctx context.Context, salt Salt, tokens []int32, keep Tier) (int, error) {
	if err := m.checkTier("Evict", keep); err != nil {
		return 0, err
	}
	var l Lease
	if err := m.Lookup(salt, tokens, &l); err != nil {
		return 0, err
	}
	defer m.Release(&l)
	return m.evictLease(ctx, &l, keep)
}

// EvictKeys is Evict for callers that computed the block keys themselves.
func (m *Manager) EvictKeys(ctx context.Context, salt Salt, keys []Key, keep Tier) (int, error) {
	if err := m.checkTier("EvictKeys", keep); err != nil {
		return 0, err
	}
	var l Lease
	if err := m.LookupKeys(salt, keys, &l); err != nil {
		return 0, err
	}
	defer m.Release(&l)
	return m.evictLease(ctx, &l, keep)
}

func (m *Manager) evictLease(ctx context.Context, l *Lease, keep Tier) (int, error) {
	m.lock()
	m.settle(l)
	var b *Batch
	short := 0
	for i := range l.Blocks {
		bl := &l.Blocks[i]
		r := m.recs.at(bl.Ref)
		if m.heldAtOrBelow(r, keep) {
			continue
		}
		from := r.best()
		if from >= keep || r.state[keep] != stateNone { // nothing above, or a copy into keep is under way
			continue
		}
		slot, ok := m.alloc(keep, len(l.Blocks)-i, r.salt)
		if !ok {
			short++
			continue
		}
		if b == nil {
			b = m.newTransfer(l)
		}
		m.startCopy(b, bl.Ref, from, keep, slot)
	}
	m.unlockAndSubmit(b)
	if err := m.Wait(ctx, l); err != nil {
		return 0, fmt.Errorf("kvtier: Evict: %w", err)
	}
	n := 0
	m.lock()
	for i := range l.Blocks {
		ref := l.Blocks[i].Ref
		r := m.recs.at(ref)
		if r.refs != 1 || !m.heldAtOrBelow(r, keep) { // in use by another, or its copy failed
			continue
		}
		dropped := false
		for t := range keep {
			if r.state[t] == stateReady {
				m.metrics.tier(t).evicted()
				m.tenantTier(r, t).evicted()
				m.freeSlot(ref, t)
				dropped = true
			}
		}
		if dropped {
			n++
		}
	}
	m.unlockAndSubmit(nil)
	if short > 0 {
		return n, fmt.Errorf("%w: Evict: no %v slot for %d blocks", ErrNoSpace, keep, short)
	}
	return n, nil
}

// heldAtOrBelow reports whether r has a ready copy in tier keep or slower.
func (m *Manager) heldAtOrBelow(r *record, keep Tier) bool {
	for t := keep; t < NumTiers; t++ {
		if r.state[t] == stateReady {
			return true
		}
	}
	return false
}

// Invalidate forgets the blocks of tokens' cached prefix (salt's) in every
// tier, for KV that changed under the same salt: no lookup finds them, their
// slots free when their last user lets go. It returns how many.
func (m *Manager) Invalidate(salt Salt, tokens []int32) (int, error) {
	var l Lease
	if err := m.Lookup(salt, tokens, &l); err != nil {
		return 0, err
	}
	return m.invalidateLease(&l), nil
}

// InvalidateKeys is Invalidate for callers that computed the block keys
// themselves.
func (m *Manager) InvalidateKeys(salt Salt, keys []Key) (int, error) {
	var l Lease
	if err := m.LookupKeys(salt, keys, &l); err != nil {
		return 0, err
	}
	return m.invalidateLease(&l), nil
}

func (m *Manager) invalidateLease(l *Lease) int {
	m.lock()
	n := 0
	for i := range l.Blocks {
		if m.invalidate(l.Blocks[i].Ref) {
			n++
		}
	}
	m.unlockAndSubmit(nil)
	m.Release(l) // the last reference of an idle block forgets it
	return n
}

// InvalidateSalt forgets every block of salt, as Invalidate does, and
// returns how many: O(blocks known) under the write lock, for rare use.
func (m *Manager) InvalidateSalt(salt Salt) int {
	m.lock()
	n := 0
	for i := uint32(0); i < m.recs.n; i++ {
		ref := BlockRef(i)
		r := m.recs.at(ref)
		if r.salt != salt || (!r.resident() && r.refs == 0) { // free records are neither
			continue
		}
		if m.invalidate(ref) {
			n++
		}
	}
	m.unlockAndSubmit(nil)
	return n
}

// invalidate marks ref invalid (lookups and inserts skip it) and frees its
// ready copies now if nothing uses it; otherwise maybeFree does when its
// last reference goes. It reports whether ref was valid.
func (m *Manager) invalidate(ref BlockRef) bool {
	r := m.recs.at(ref)
	if r.flags&flagInvalid != 0 {
		return false
	}
	if m.events != nil {
		m.noteInvalid(ref)
	}
	r.flags |= flagInvalid
	m.metrics.invalidated()
	if r.refs == 0 {
		m.dropInvalid(ref)
	}
	return true
}

// dropInvalid frees every copy of an invalid block nobody uses (all ready:
// a copy or writer would hold a reference), which forgets the record.
func (m *Manager) dropInvalid(ref BlockRef) {
	r := m.recs.at(ref)
	for t := range NumTiers {
		if r.state[t] == stateReady {
			m.policyOf(t, r).Remove(ref)
			m.tiers[t].free = append(m.tiers[t].free, r.slot[t])
			m.setState(ref, t, stateNone)
		}
	}
	m.maybeFree(ref)
}

func (m *Manager) meta(t Tier, r *record) policy.Meta {
	meta := policy.Meta{Bytes: m.tiers[t].slotBytes}
	if m.recompute != nil {
		meta.RecomputeSeconds = m.recompute(int(r.depth))
	}
	return meta
}

// alloc finds a slot in tier t for a block of salt, evicting if needed.
// Victims come from the tier's policy among ready blocks nobody uses (with
// Config.Tenants: salt's own when it is at its cap, see victim). A victim already held by
// the next tier is dropped; otherwise, in write-back mode, it is demoted (its
// slot frees when the copy completes) and the search goes on until it has
// started want demotions (the slots the caller still needs); otherwise it is
// dropped.
func (m *Manager) alloc(t Tier, want int, salt Salt) (Slot, bool) {
	ts := &m.tiers[t]
	own := m.atCap(t, salt)
	if own < 0 {
		if n := len(ts.free); n > 0 {
			s := ts.free[n-1]
			ts.free = ts.free[:n-1]
			return s, true
		}
		if ts.next < ts.usable {
			s := Slot(ts.next)
			ts.next++
			return s, true
		}
	}
	demotions := 0
	for {
		if demotions >= want {
			// The slots this caller needs free when the demotions complete.
			m.metrics.noSpaceHit()
			return 0, false
		}
		v, ok := m.victim(t, own)
		if !ok {
			m.metrics.noSpaceHit()
			return 0, false
		}
		m.ops++
		r := m.recs.at(v)
		if !r.evictableIn(t) {
			invariants.Failf("policy of %v evicted block %#x that is %v with %d references (%d copies, %d of them in this tier)", t, uint64(r.key), r.state[t], r.refs, r.xfers, r.copying[t])
		}
		m.metrics.tier(t).evicted()
		m.tenantTier(r, t).evicted()
		next := ts.below
		if next < NumTiers && r.state[next] == stateNone && !m.writeThrough && m.admitWrite(next, r) {
			if ns, ok := m.alloc(next, 1, r.salt); ok {
				r = m.recs.at(v)
				m.setState(v, t, stateEvicting)
				m.metrics.tier(t).demoted()
				m.startCopy(m.background(), v, t, next, ns)
				demotions++
				continue
			}
		}
		slot := r.slot[t]
		m.setState(v, t, stateNone)
		m.maybeFree(v)
		return slot, true
	}
}

// freeSlot takes ref out of tier t and returns its slot to the free list.
// The caller guarantees no copy reads or writes the slot (invariant 3).
func (m *Manager) freeSlot(ref BlockRef, t Tier) {
	if t == GPU && m.gpuWritten != nil {
		m.gpuWritten[m.recs.at(ref).slot[GPU]] = nil
	}
	// The policy tracks exactly the writing and ready blocks of its tier.
	// A victim of Evict is already gone from it; Remove is then a no-op
	// (ghost entries stay).
	r := m.recs.at(ref)
	m.policyOf(t, r).Remove(ref)
	slot := r.slot[t]
	m.setState(ref, t, stateNone)
	m.tiers[t].free = append(m.tiers[t].free, slot)
	m.maybeFree(ref)
}

// setState moves ref's state in tier t, keeping the gauges.
func (m *Manager) setState(ref BlockRef, t Tier, s blockState) {
	r := m.recs.at(ref)
	old := r.state[t]
	r.state[t] = s
	if m.events != nil {
		m.noteState(ref, t, old, s)
	}
	g := &m.gauges
	switch {
	case old == stateNone && s != stateNone:
		g.resident[t]++
		if m.ten != nil {
			m.tenantResident(r, t, 1)
		}
		if r.flags&flagPinned != 0 {
			m.pins.resident[t][m.pins.of[ref].priority]++
		}
		if r.refs > 0 {
			m.stripes[0].inUse[t].Add(1)
		}
	case old != stateNone && s == stateNone:
		g.resident[t]--
		if m.ten != nil {
			m.tenantResident(r, t, -1)
		}
		if r.flags&flagPinned != 0 {
			m.pins.resident[t][m.pins.of[ref].priority]--
		}
		if r.refs > 0 {
			m.stripes[0].inUse[t].Add(-1)
		}
		r.slot[t] = noSlot
	}
}

// SetUsableSlots lets tier t hand out only its first n slots until a later
// call raises n: a host tier still being pinned serves from what is pinned.
func (m *Manager) SetUsableSlots(t Tier, n int) error {
	if err := m.checkTier("SetUsableSlots", t); err != nil {
		return err
	}
	if n < 0 || n > int(m.slots[t]) {
		return fmt.Errorf("%w: SetUsableSlots: %d slots for the %v tier of %d", ErrBadInput, n, t, m.slots[t])
	}
	m.lock()
	m.tiers[t].usable = uint32(n)
	m.unlock()
	return nil
}
