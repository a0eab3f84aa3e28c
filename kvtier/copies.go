package kvtier

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"kvtier.dev/internal/invariants"
)

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
	if next == NumTiers || r.state[next] != stateNone || r.flags&flagInvalid != 0 || !m.admitWrite(next, r) {
		return
	}
	slot, ok := m.alloc(next, 1, r.salt)
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
	if r.xfers == math.MaxUint8 || r.copying[from] == math.MaxUint8 || r.copying[to] == math.MaxUint8 {
		invariants.Failf("kvtier: block %#x: more than %d copies at once", uint64(r.key), math.MaxUint8)
	}
	r.xfers++
	r.copying[from]++
	r.copying[to]++
	m.copiesFrom[from]++
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
		invariants.Failf("kvtier: Batch.Complete(%d) called twice or out of range (%d ops)", i, len(t.done))
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
		invariants.Failf("completion of block %#x into %v slot %d finds it %v in slot %d", uint64(op.Key), op.To, op.ToSlot, r.state[op.To], r.slot[op.To])
	}
	demotion := r.state[op.From] == stateEvicting
	if err == nil {
		m.setState(op.Ref, op.To, stateReady)
		m.metrics.tier(op.To).in(m.tiers[op.To].slotBytes)
		m.metrics.tier(op.From).out(m.tiers[op.From].slotBytes)
		m.tenantTier(r, op.To).in(m.tiers[op.To].slotBytes)
		m.tenantTier(r, op.From).out(m.tiers[op.From].slotBytes)
		if demotion {
			m.freeSlot(op.Ref, op.From)
		}
		m.propagate(op.Ref, op.To)
	} else {
		dropped := errors.Is(err, ErrNotWanted)
		if !dropped {
			m.metrics.moveFailure()
		}
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
		if l := t.lease; l != nil && l.err == nil && !dropped {
			l.err = fmt.Errorf("%w: block %#x from %v slot %d to %v slot %d: %w", ErrMove, uint64(op.Key), op.From, op.FromSlot, op.To, op.ToSlot, err)
		}
	}
	r = m.recs.at(op.Ref)
	r.xfers--
	r.copying[op.From]--
	r.copying[op.To]--
	m.copyEnded(op.From)
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
	if !invariants.Enabled {
		return
	}
	m.ops++
	if m.recs.live() <= 4096 || m.ops%1024 == 0 {
		m.checkInvariants()
	}
}

// Drain waits until every copy submitted so far has completed, with the
// copies their completions start, and every release waiting for a
// CommitAfter event has happened, or until ctx ends. For shutdown and tests.
func (m *Manager) Drain(ctx context.Context) error {
	for {
		m.lock()
		if m.busy == 0 {
			m.unlock()
			return nil
		}
		if m.drained == nil {
			m.drained = make(chan struct{})
		}
		ch := m.drained
		m.unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("kvtier: Drain: %w", ctx.Err())
		}
	}
}

// Flush writes every block down to the slowest tier present (write-back's
// dirty blocks), waiting for the copies. Blocks that find no slot stay
// dirty: Flush then returns ErrNoSpace with their count.
func (m *Manager) Flush(ctx context.Context) error {
	bottom := NumTiers
	for t := NumTiers - 1; t < NumTiers; t-- {
		if m.tiers[t].present {
			bottom = t
			break
		}
	}
	const maxRounds = 4 * int(NumTiers) // each round moves every dirty block one tier down
	for round := 0; ; round++ {
		// The copies in flight first: a block still on its way down (a
		// write-through copy) is dirty once it lands.
		if err := m.Drain(ctx); err != nil {
			return fmt.Errorf("kvtier: Flush: %w", err)
		}
		started, stuck := 0, 0
		m.lock()
		for i := uint32(0); i < m.recs.n; i++ {
			ref := BlockRef(i)
			r := m.recs.at(ref)
			from, ok := slowest(r)
			if !ok || from >= bottom || r.state[from] != stateReady || r.flags&flagInvalid != 0 {
				continue // free, clean, on its way down, or forgotten
			}
			next := m.tiers[from].below
			slot, ok := m.alloc(next, 1, r.salt)
			if !ok {
				stuck++
				continue
			}
			m.startCopy(m.background(), ref, from, next, slot)
			started++
		}
		m.unlockAndSubmit(nil)
		if started == 0 || round == maxRounds {
			if err := m.Drain(ctx); err != nil {
				return fmt.Errorf("kvtier: Flush: %w", err)
			}
			if stuck > 0 || started > 0 {
				return fmt.Errorf("%w: Flush: %d blocks found no slot in a slower tier", ErrNoSpace, stuck+started)
			}
			return nil
		}
	}
}

// slowest returns the slowest tier where r has a copy (in any state).
func slowest(r *record) (Tier, bool) {
	for t := NumTiers - 1; t < NumTiers; t-- {
		if r.state[t] != stateNone {
			return t, true
		}
	}
	return 0, false
}
