package kvtier

import (
	"fmt"
	"slices"
)

// The manager's internals are split by job: lookup.go (lookups and
// inserts), evict.go (eviction, slots and invalidation), copies.go (the
// copies handed to the Mover and their completions) and release.go
// (references and releases). Every unexported function there runs with the
// write lock held (m.lock) unless its comment says otherwise. A record's
// refs are written plainly under the write lock and atomically under a
// stripe's read lock (lookups and releases); the lock orders the two.

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
	l.requested, l.tokens, l.estimate = 0, 0, Estimate{}
	l.quiet = false
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
	if !r.is(salt, parent, depth) {
		return false
	}
	if tok == nil {
		return true
	}
	return r.flags&flagTokens != 0 && tokensEqual(m.recs.tokensOf(ref), tok)
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
			idx, ok := m.index.find(salt, keys[base+j])
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

	if c := m.stripeCounters(st); c != nil && !l.quiet {
		if m.ten != nil {
			m.countTenantLookup(salt, len(keys), &hits)
		}
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

// insert is Insert after hashing: hashes[i] is block i's tokenHash when
// tokens is not nil. Takes the write lock.
func (m *Manager) insert(salt Salt, keys []Key, tokens []int32, hashes []uint32, tier Tier, l *Lease) error {
	bt := m.blockTokens
	var err error
	m.lock()
	l.leased = true
	parent := Key(0)
	for i, k := range keys {
		var tok []int32
		var th uint32
		if tokens != nil {
			tok, th = tokens[i*bt:(i+1)*bt], hashes[i]
		}
		idx, found := m.index.find(salt, k)
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
					m.addTokens(ref, tok, th)
				} else if !slices.Equal(m.recs.tokensOf(ref), tok) {
					m.metrics.mismatch()
					break
				}
			}
			switch r.state[tier] {
			case stateReady:
				m.policyTouch(tier, ref)
				m.ref(ref)
				l.Blocks = append(l.Blocks, Block{Key: k, Ref: ref, Position: i, Tier: tier, Slot: r.slot[tier]})
				parent = k
				continue
			case stateWriting:
				// Another lease writes it; lease it without Write.
				m.ref(ref)
				l.Blocks = append(l.Blocks, Block{Key: k, Ref: ref, Position: i, Tier: tier, Slot: r.slot[tier]})
				parent = k
				continue
			}
			if r.state[tier] == stateEvicting {
				break // leaving this tier; a later Insert can bring it back
			}
		} else {
			ref = m.newRecord(k, parent, salt, i, tok, th)
		}
		m.ref(ref) // before alloc, so that no eviction can take it
		slot, ok := m.alloc(tier, len(keys)-i, salt)
		if !ok {
			m.unref(ref)
			err = fmt.Errorf("%w: %v tier: block %d of %d (key %#x)", ErrNoSpace, tier, i, len(keys), uint64(k))
			break
		}
		r := m.recs.at(ref)
		r.slot[tier] = slot
		m.setState(ref, tier, stateWriting)
		m.policyInsert(tier, ref)
		l.Blocks = append(l.Blocks, Block{Key: k, Ref: ref, Position: i, Tier: tier, Slot: slot, Write: true})
		parent = k
	}
	m.unlockAndSubmit(nil)
	return err
}

// newRecord allocates and indexes the record of block k; th is tok's
// tokenHash (unused without tok). Write lock.
func (m *Manager) newRecord(k, parent Key, salt Salt, depth int, tok []int32, th uint32) BlockRef {
	ref := m.recs.alloc()
	r := m.recs.at(ref)
	r.key, r.parent, r.salt, r.depth = k, parent, salt, uint32(depth)
	for t := range r.slot {
		r.slot[t] = noSlot
	}
	if tok != nil {
		copy(m.recs.tokensOf(ref), tok)
		r.flags |= flagTokens
	} else {
		th = 0
	}
	m.index.insert(salt, k, uint32(ref), th)
	return ref
}

// addTokens stores tok, whose tokenHash is th, as the tokens of block ref,
// stored without them until now, and th in its index entry. Write lock.
func (m *Manager) addTokens(ref BlockRef, tok []int32, th uint32) {
	r := m.recs.at(ref)
	copy(m.recs.tokensOf(ref), tok)
	r.flags |= flagTokens
	m.index.setTokens(r.salt, r.key, th)
}

const noSlot = ^Slot(0)
