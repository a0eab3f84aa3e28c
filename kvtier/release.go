package kvtier

import (
	"slices"
	"sync/atomic"

	"kvtier.dev/internal/invariants"
)

func (m *Manager) ref(ref BlockRef) {
	r := m.recs.at(ref)
	if r.refs == 0 {
		for t, s := range r.state {
			if s != stateNone {
				m.stripes[0].inUse[t].Add(1)
			}
		}
	}
	r.refs++
}

func (m *Manager) unref(ref BlockRef) {
	r := m.recs.at(ref)
	if r.refs == 0 {
		invariants.Failf("kvtier: block %#x released more often than referenced", uint64(r.key))
	}
	r.refs--
	if r.refs == 0 {
		for t, s := range r.state {
			if s != stateNone {
				m.stripes[0].inUse[t].Add(-1)
			}
		}
		m.maybeFree(ref)
	}
}

// maybeFree forgets a record that no tier holds and nothing references,
// and frees the copies of an invalidated one that nothing references.
func (m *Manager) maybeFree(ref BlockRef) {
	r := m.recs.at(ref)
	if r.refs != 0 {
		return
	}
	if r.resident() {
		if r.flags&flagInvalid != 0 {
			m.dropInvalid(ref) // frees its slots, then comes back here
		}
		return
	}
	if r.flags&flagPinned != 0 {
		m.unpinBlock(ref)
	}
	m.index.remove(r.salt, r.key)
	m.recs.release(ref)
}

// settle records the uses a lookup made: policy touches of the tiers that
// served each block (skipping blocks touched very recently, see recent),
// and the request's keys for the admitters. Lookups only read-lock, so these
// wait for the lease's next write-locked operation (Onboard, Offload, or a
// Release that needs the write lock; other Releases queue them, see
// releaseShared).
func (m *Manager) settle(l *Lease) {
	if !l.lookup {
		return
	}
	l.lookup = false
	for i := range l.Blocks {
		b := &l.Blocks[i]
		if !m.recent(b.Tier, m.recs.at(b.Ref)) {
			m.policyTouch(b.Tier, b.Ref)
		}
	}
	if m.admitters {
		for _, k := range l.keys {
			m.recordAccess(k)
		}
	}
}

// releaseShared is Release for a lease that reserved no slot, under the
// read lock of its stripe only: a pinned lease is unpinned; otherwise its
// references are dropped atomically. The lookup's touches and admission records are queued in the stripe (see
// stripe.go). The last reference to a block that no tier holds any more
// (its only copy was lost) is left to the write lock, which forgets the
// record. It reports false, having done nothing, when l reserved slots.
func (m *Manager) releaseShared(l *Lease) bool {
	for i := range l.Blocks {
		if l.Blocks[i].Write {
			return false
		}
	}
	st := m.stripeOf(l)
	var users [NumTiers]int64
	touches := l.touches[:0]
	slow := 0
	var now, window [NumTiers]uint32 // see recent
	for t := range NumTiers {
		now[t], window[t] = m.ticks[t].Load(), m.tiers[t].window
	}
	m.rlock(st)
	pinned := l.pinned
	if pinned {
		m.unpin(st, l)
	}
	for i := range l.Blocks {
		b := l.Blocks[i]
		r := m.recs.at(b.Ref)
		if l.lookup && now[b.Tier]-atomic.LoadUint32(&r.touched[b.Tier]) >= window[b.Tier] {
			touches = append(touches, touch{key: b.Key, ref: b.Ref, tier: b.Tier})
		}
		if pinned {
			continue
		}
		n := atomic.AddUint32(&r.refs, ^uint32(0))
		if n == ^uint32(0) {
			invariants.Failf("kvtier: block %#x released more often than referenced", uint64(r.key))
		}
		if n != 0 {
			continue
		}
		if !r.resident() || r.flags&flagInvalid != 0 {
			// Only the write lock may forget it: put the reference
			// back (no writer runs while this stripe is read-locked,
			// and readers never free) and leave the block in l for
			// unref under the write lock.
			atomic.AddUint32(&r.refs, 1)
			l.Blocks[slow] = b
			slow++
			continue
		}
		for t, s := range r.state {
			if s != stateNone {
				users[t]--
			}
		}
	}
	for t, n := range users {
		if n != 0 {
			st.inUse[t].Add(n)
		}
	}
	m.runlock(st)
	if l.lookup && m.admitters {
		for _, k := range l.keys {
			touches = append(touches, touch{key: k, tier: NumTiers})
		}
	}
	l.lookup = false
	l.touches = touches[:0]
	l.Blocks = l.Blocks[:slow]
	if slow > 0 {
		m.lock()
		for i := range l.Blocks {
			m.unref(l.Blocks[i].Ref)
		}
		m.unlockAndSubmit(nil)
	}
	l.Blocks = l.Blocks[:0]
	l.leased = false
	if len(touches) > 0 {
		m.pushTouches(st, touches)
	}
	return true
}

// Release drops the lease's references and invalidates its layer events;
// blocks Insert reserved and not committed are forgotten. The lease is free
// for reuse at once (after CommitAfter, references drop once the event completed).
func (m *Manager) Release(l *Lease) {
	l.dropLayers()
	if !l.leased {
		return
	}
	if w := l.written; w != nil {
		l.written = nil
		if done, err := w.Query(); !done || err != nil {
			m.releaseAfter(l, w)
			return
		}
		m.lock()
		m.forgetWritten(l, w)
		m.unlock()
	}
	if m.releaseShared(l) {
		return
	}
	m.lock()
	m.settle(l)
	for i := range l.Blocks {
		b := &l.Blocks[i]
		if b.Write {
			m.freeSlot(b.Ref, b.Tier)
		}
		m.unref(b.Ref)
	}
	l.Blocks = l.Blocks[:0]
	l.leased = false
	m.unlockAndSubmit(nil)
}

// releaseAfter hands l's references to a lease of the manager's, released
// once written has completed (or failed: the slots are then as good as
// their last complete write), and empties l. Not on a request's hot path:
// it allocates the stand-in lease.
func (m *Manager) releaseAfter(l *Lease, written Event) {
	// l is an insert's lease (CommitAfter sets written only where it
	// committed a block): it holds plain references, no pin.
	stand := &Lease{Blocks: slices.Clone(l.Blocks), m: m, leased: true, stripe: l.stripe}
	l.Blocks = l.Blocks[:0]
	l.leased = false
	m.lock()
	m.busy++
	m.unlock()
	go func() {
		_ = written.Synchronize()
		m.lock()
		m.forgetWritten(stand, written)
		m.unlock()
		m.Release(stand)
		m.lock()
		m.idle()
		m.unlock()
	}()
}

// forgetWritten drops written from the GPU slots of l's blocks: it has
// completed, and the caller releases l.
func (m *Manager) forgetWritten(l *Lease, written Event) {
	for _, b := range l.Blocks {
		if b.Tier == GPU && m.gpuWritten[b.Slot] == written {
			m.gpuWritten[b.Slot] = nil
		}
	}
}
