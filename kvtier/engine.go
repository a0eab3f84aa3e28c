package kvtier

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"kvtier.dev/kvtier/policy"
)

// This file holds the manager's internals; every function here runs with
// the write lock held (m.lock) unless its comment says otherwise. A
// record's refs are written plainly under the write lock and atomically
// under a stripe's read lock (lookups and releases); the lock orders the
// two.

func (m *Manager) checkTier(op string, t Tier) error {
	if t >= NumTiers || !m.tiers[t].present {
		return fmt.Errorf("%w: %s: tier %v is not configured", ErrBadInput, op, t)
	}
	return nil
}

// begin readies l for a new lookup or insert. Called without the lock.
func (m *Manager) begin(l *Lease) error {
	if l.leased {
		return fmt.Errorf("%w: lease still holds %d blocks: Release it first", ErrBadInput, len(l.Blocks))
	}
	if l.m != nil && l.m != m {
		return fmt.Errorf("%w: lease belongs to another manager", ErrBadInput)
	}
	if l.done == nil {
		l.done = make(chan struct{}, 1)
	}
	l.m = m
	l.Blocks = l.Blocks[:0]
	l.requested = 0
	return nil
}

func (m *Manager) hook(keys []Key) {
	if m.testKeyHook != nil {
		for i := range keys {
			keys[i] = m.testKeyHook(keys[i])
		}
	}
}

// verify reports whether record r is block depth of a request with salt whose
// previous block is parent and whose block tokens are tok (nil: not checked).
func (m *Manager) verify(ref BlockRef, r *record, salt Salt, parent Key, depth int, tok []int32) bool {
	if r.salt != salt || r.parent != parent || r.depth != uint32(depth) {
		return false
	}
	if tok == nil {
		return true
	}
	return r.flags&flagTokens != 0 && slices.Equal(m.recs.tokensOf(ref), tok)
}

func (m *Manager) recordAccess(k Key) {
	for t := range NumTiers {
		if a := m.tiers[t].admitter; a != nil {
			a.Record(k)
		}
	}
}

// lookup fills l with the verified ready prefix of keys. It read-locks l's
// stripe: lookups run in parallel with each other, and write nothing but
// l and their stripe. The lease is pinned (see pin) rather than adding a
// reference to each block: the next write lock turns the pin into
// references before anything can evict. The policy touches and admission
// records wait for Release.
func (m *Manager) lookup(salt Salt, keys []Key, tokens []int32, l *Lease) {
	st := m.stripeOf(l)
	var hits [NumTiers]uint64
	mismatches := uint64(0)
	bt := m.blockTokens
	l.requested = len(keys)
	m.rlock(st)
	// Blocks go in batches, each step over the whole batch before the
	// next, so that the cache misses of a batch's index probes, records
	// and tokens (three a block in a large cache) overlap rather than
	// follow one another. A miss wastes at most one batch of probes.
	// Keys are chained on the tokens, not on what is cached, so a block
	// after a missing one (a hole) still verifies against its parent's
	// key: up to maxHoles of them are skipped.
	const batch = 16
	var refs [batch]BlockRef
	var found [batch]bool
	parent := Key(0)
	holes, pending := 0, 0 // holes skipped; of them, those after the last block found
blocks:
	for base := 0; base < len(keys); base += batch {
		n := min(batch, len(keys)-base)
		for j := range n {
			idx, ok := m.index.find(keys[base+j])
			refs[j], found[j] = BlockRef(idx), ok
			if !ok && m.maxHoles == 0 {
				n = j + 1
				break
			}
		}
		for j := range n {
			i, ref := base+j, refs[j]
			ok := found[j]
			if ok {
				r := m.recs.at(ref)
				var tok []int32
				if tokens != nil {
					tok = tokens[i*bt : (i+1)*bt]
				}
				if !m.verify(ref, r, salt, parent, i, tok) {
					mismatches++
					ok = false
				} else if best := r.best(); best == NumTiers || r.flags&flagInvalid != 0 {
					ok = false
				} else {
					l.Blocks = append(l.Blocks, Block{Key: keys[i], Ref: ref, Tier: best, Slot: r.slot[best], Position: i})
					hits[best]++
					pending = 0
				}
			}
			if !ok {
				if holes == m.maxHoles {
					break blocks
				}
				holes++
				pending++
			}
			parent = keys[i]
		}
	}
	holes -= pending // misses after the last block found are no holes
	if len(l.Blocks) > 0 {
		m.pin(st, l)
	}
	m.runlock(st)
	l.leased = true
	l.lookup = true

	if c := m.stripeCounters(st); c != nil {
		n := uint64(len(keys))
		c.lookup(len(keys), len(l.Blocks))
		if holes > 0 {
			c.holes.Add(uint64(holes))
		}
		if mismatches > 0 {
			c.mismatches.Add(mismatches)
		}
		served := uint64(0)
		for t := range NumTiers {
			if !m.tiers[t].present {
				continue
			}
			tc := &c.tiers[t]
			if hits[t] > 0 {
				tc.hits.Add(hits[t])
			}
			// Blocks a faster tier did not serve and this one did not
			// either: served by a slower tier, or not found at all.
			if miss := n - served - hits[t]; miss > 0 {
				tc.misses.Add(miss)
			}
			served += hits[t]
		}
	}
}

// insert is Insert after hashing. Takes the write lock.
func (m *Manager) insert(salt Salt, keys []Key, tokens []int32, tier Tier, l *Lease) error {
	bt := m.blockTokens
	var err error
	m.lock()
	l.leased = true
	if m.admitters {
		for _, k := range keys {
			m.recordAccess(k)
		}
	}
	parent := Key(0)
	for i, k := range keys {
		var tok []int32
		if tokens != nil {
			tok = tokens[i*bt : (i+1)*bt]
		}
		idx, found := m.index.find(k)
		ref := BlockRef(idx)
		if found {
			r := m.recs.at(ref)
			if !m.verify(ref, r, salt, parent, i, nil) {
				m.metrics.mismatch()
				break
			}
			if r.flags&flagInvalid != 0 {
				break // forgotten once its users let go; Insert it again then
			}
			if tok != nil {
				if r.flags&flagTokens == 0 {
					copy(m.recs.tokensOf(ref), tok)
					r.flags |= flagTokens
				} else if !slices.Equal(m.recs.tokensOf(ref), tok) {
					m.metrics.mismatch()
					break
				}
			}
			switch r.state[tier] {
			case stateReady:
				m.policyTouch(tier, ref)
				m.ref(ref)
				l.Blocks = append(l.Blocks, Block{Key: k, Ref: ref, Tier: tier, Slot: r.slot[tier]})
				parent = k
				continue
			case stateWriting:
				// Another lease writes it; lease it without Write.
				m.ref(ref)
				l.Blocks = append(l.Blocks, Block{Key: k, Ref: ref, Tier: tier, Slot: r.slot[tier]})
				parent = k
				continue
			}
			if r.state[tier] == stateEvicting {
				break // leaving this tier; a later Insert can bring it back
			}
		} else {
			ref = m.newRecord(k, parent, salt, i, tok)
		}
		m.ref(ref) // before alloc, so that no eviction can take it
		slot, ok := m.alloc(tier, len(keys)-i)
		if !ok {
			m.unref(ref)
			err = fmt.Errorf("%w: %v tier: block %d of %d (key %#x)", ErrNoSpace, tier, i, len(keys), uint64(k))
			break
		}
		r := m.recs.at(ref)
		r.slot[tier] = slot
		m.setState(ref, tier, stateWriting)
		m.policyInsert(tier, ref)
		l.Blocks = append(l.Blocks, Block{Key: k, Ref: ref, Tier: tier, Slot: slot, Write: true})
		parent = k
	}
	m.unlockAndSubmit(nil)
	return err
}

func (m *Manager) meta(t Tier, r *record) policy.Meta {
	meta := policy.Meta{Bytes: m.tiers[t].slotBytes}
	if m.recompute != nil {
		meta.RecomputeCost = m.recompute(int(r.depth))
	}
	return meta
}

func (m *Manager) newRecord(k, parent Key, salt Salt, depth int, tok []int32) BlockRef {
	ref := m.recs.alloc()
	r := m.recs.at(ref)
	r.key, r.parent, r.salt, r.depth = k, parent, salt, uint32(depth)
	for t := range r.slot {
		r.slot[t] = noSlot
	}
	if tok != nil {
		copy(m.recs.tokensOf(ref), tok)
		r.flags |= flagTokens
	}
	m.index.insert(k, uint32(ref))
	return ref
}

const noSlot = ^Slot(0)

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
	m.index.remove(r.key)
	m.recs.release(ref)
}

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
		panic(fmt.Sprintf("kvtier: block %#x released more often than referenced", uint64(r.key)))
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

// setState moves ref's state in tier t, keeping the gauges.
func (m *Manager) setState(ref BlockRef, t Tier, s blockState) {
	r := m.recs.at(ref)
	old := r.state[t]
	r.state[t] = s
	g := &m.gauges
	switch {
	case old == stateNone && s != stateNone:
		g.resident[t]++
		if r.refs > 0 {
			m.stripes[0].inUse[t].Add(1)
		}
	case old != stateNone && s == stateNone:
		g.resident[t]--
		if r.refs > 0 {
			m.stripes[0].inUse[t].Add(-1)
		}
		r.slot[t] = noSlot
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
	m.tiers[t].policy.Remove(ref)
	r := m.recs.at(ref)
	slot := r.slot[t]
	m.setState(ref, t, stateNone)
	m.tiers[t].free = append(m.tiers[t].free, slot)
	m.maybeFree(ref)
}

// alloc finds a free slot in tier t, evicting if needed. Victims come from
// the tier's policy among ready blocks nobody uses. A victim already held by
// the next tier is dropped; otherwise, in write-back mode, it is demoted (its
// slot frees when the copy completes) and the search goes on until it has
// started want demotions (the slots the caller still needs); otherwise it is
// dropped.
func (m *Manager) alloc(t Tier, want int) (Slot, bool) {
	ts := &m.tiers[t]
	if n := len(ts.free); n > 0 {
		s := ts.free[n-1]
		ts.free = ts.free[:n-1]
		return s, true
	}
	if ts.next < ts.slots {
		s := Slot(ts.next)
		ts.next++
		return s, true
	}
	demotions := 0
	for {
		if demotions >= want {
			// The slots this caller needs free when the demotions complete.
			m.metrics.noSpaceHit()
			return 0, false
		}
		v, ok := ts.policy.Evict(ts.evictable)
		if !ok {
			m.metrics.noSpaceHit()
			return 0, false
		}
		m.ops++
		r := m.recs.at(v)
		if r.state[t] != stateReady || r.refs != 0 {
			panic(fmt.Sprintf("kvtier: policy of %v evicted block %#x that is %v with %d references", t, uint64(r.key), r.state[t], r.refs))
		}
		m.metrics.tier(t).evicted()
		next := ts.below
		if next < NumTiers && r.state[next] == stateNone && !m.writeThrough && m.admit(next, r.key) {
			if ns, ok := m.alloc(next, 1); ok {
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

func (m *Manager) admit(t Tier, k Key) bool {
	a := m.tiers[t].admitter
	return a == nil || a.Admit(k)
}

// propagate copies a block that just became ready in tier t on to the next
// tier, in write-through mode, if admitted and a slot is free, as a
// background copy.
func (m *Manager) propagate(ref BlockRef, t Tier) {
	if m.writeThrough {
		m.propagateIn(nil, ref, t)
	}
}

// propagateIn is propagate into batch b (nil: the background batch).
func (m *Manager) propagateIn(b *Batch, ref BlockRef, t Tier) {
	if !m.writeThrough {
		return
	}
	next := m.tiers[t].below
	r := m.recs.at(ref)
	if next == NumTiers || r.state[next] != stateNone || r.flags&flagInvalid != 0 || !m.admit(next, r.key) {
		return
	}
	slot, ok := m.alloc(next, 1)
	if !ok {
		return
	}
	if b == nil {
		b = m.background()
	}
	m.startCopy(b, ref, t, next, slot)
}

// startCopy records a copy of ref from tier `from` into slot of tier `to`:
// the destination is reserved (writing) and the copy holds a reference.
func (m *Manager) startCopy(t *Batch, ref BlockRef, from, to Tier, slot Slot) {
	r := m.recs.at(ref)
	r.slot[to] = slot
	m.setState(ref, to, stateWriting)
	m.policyInsert(to, ref)
	m.ref(ref)
	op := MoveOp{Key: r.key, Ref: ref, Parent: r.parent, Salt: r.salt, Position: int(r.depth),
		From: from, FromSlot: r.slot[from], To: to, ToSlot: slot}
	if r.flags&flagTokens != 0 {
		op.Tokens = m.recs.tokensOf(ref) // written once, before the flag
	}
	if from == GPU && m.gpuWritten != nil {
		op.After = m.gpuWritten[op.FromSlot]
	}
	t.Ops = append(t.Ops, op)
}

func (m *Manager) newTransfer(l *Lease) *Batch {
	var t *Batch
	if n := len(m.xpool); n > 0 {
		t = m.xpool[n-1]
		m.xpool = m.xpool[:n-1]
	} else {
		t = &Batch{m: m}
	}
	t.lease = l
	t.Ops = t.Ops[:0]
	m.busy++
	if l != nil {
		l.xfers++
	}
	return t
}

func (m *Manager) background() *Batch {
	if m.bg == nil {
		m.bg = m.newTransfer(nil)
	}
	return m.bg
}

// unlockAndSubmit releases the write lock and then submits t and the background copies
// decided under the lock.
func (m *Manager) unlockAndSubmit(t *Batch) {
	m.checkSampled()
	bg := m.bg
	m.bg = nil
	m.unlock()
	if t != nil {
		m.submit(t)
	}
	if bg != nil {
		m.submit(bg)
	}
}

// submit hands t to the mover. Called without the lock.
func (m *Manager) submit(t *Batch) {
	n := len(t.Ops)
	m.lock()
	t.remaining = n
	t.done = slices.Grow(t.done[:0], n)[:n]
	clear(t.done)
	if n == 0 {
		m.finish(t)
		m.unlock()
		return
	}
	m.unlock()
	if err := m.mover.Submit(t); err != nil {
		m.lock()
		if t.remaining > 0 { // not recycled: some ops are still ours to fail
			for i := range t.done {
				if !t.done[i] && t.remaining > 0 {
					m.completeLocked(t, i, fmt.Errorf("submit: %w", err))
				}
			}
		}
		m.unlockAndSubmit(nil)
	}
}

// complete processes one op's completion. Called without the lock.
func (m *Manager) complete(t *Batch, i int, err error) {
	m.lock()
	if i < 0 || i >= len(t.done) || t.done[i] || t.remaining == 0 {
		m.unlock()
		panic(fmt.Sprintf("kvtier: Batch.Complete(%d) called twice or out of range (%d ops)", i, len(t.done)))
	}
	m.completeLocked(t, i, err)
	m.unlockAndSubmit(nil)
}

func (m *Manager) completeLocked(t *Batch, i int, err error) {
	op := t.Ops[i]
	t.done[i] = true
	t.remaining--
	r := m.recs.at(op.Ref)
	if r.state[op.To] != stateWriting || r.slot[op.To] != op.ToSlot {
		panic(fmt.Sprintf("kvtier: completion of block %#x into %v slot %d finds it %v in slot %d", uint64(op.Key), op.To, op.ToSlot, r.state[op.To], r.slot[op.To]))
	}
	demotion := r.state[op.From] == stateEvicting
	if err == nil {
		m.setState(op.Ref, op.To, stateReady)
		m.metrics.tier(op.To).in(m.tiers[op.To].slotBytes)
		m.metrics.tier(op.From).out(m.tiers[op.From].slotBytes)
		if demotion {
			m.freeSlot(op.Ref, op.From)
		}
		m.propagate(op.Ref, op.To)
	} else {
		m.metrics.moveFailure()
		m.freeSlot(op.Ref, op.To)
		if demotion { // the source is intact: keep it
			m.setState(op.Ref, op.From, stateReady)
			m.policyInsert(op.From, op.Ref)
		} else if op.From == NVMe && r.state[NVMe] == stateReady && errors.Is(err, ErrSourceLost) {
			// The manager reads an NVMe copy only to load it into the
			// GPU, where the block is then being written, so this op was
			// the slot's only reader.
			m.freeSlot(op.Ref, NVMe)
		}
		if l := t.lease; l != nil && l.err == nil {
			l.err = fmt.Errorf("%w: block %#x from %v slot %d to %v slot %d: %w", ErrMove, uint64(op.Key), op.From, op.FromSlot, op.To, op.ToSlot, err)
		}
	}
	m.unref(op.Ref)
	if t.remaining == 0 {
		m.finish(t)
	}
}

// finish recycles a transfer whose ops all completed and wakes its lease.
func (m *Manager) finish(t *Batch) {
	if l := t.lease; l != nil {
		l.xfers--
		if l.xfers == 0 {
			select {
			case l.done <- struct{}{}:
			default:
			}
		}
	}
	t.lease = nil
	clear(t.Ops) // drop the token slices
	t.Ops = t.Ops[:0]
	m.xpool = append(m.xpool, t)
	m.idle()
}

// idle ends one unit of background work (a batch, a deferred release) and
// wakes Drain when none is left.
func (m *Manager) idle() {
	m.busy--
	if m.busy == 0 && m.drained != nil {
		close(m.drained)
		m.drained = nil
	}
}

func (m *Manager) checkSampled() {
	if !invariantsEnabled {
		return
	}
	m.ops++
	if m.recs.live() <= 4096 || m.ops%1024 == 0 {
		m.checkInvariants()
	}
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
			panic(fmt.Sprintf("kvtier: block %#x released more often than referenced", uint64(r.key)))
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
