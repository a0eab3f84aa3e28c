package kvtier

import (
	"context"
	"fmt"
	"slices"
)

// A request whose Insert found too few slots in a tier (ErrNoSpace) while
// copies still read that tier's blocks (write-through copies and offloads
// from the GPU, demotions) lacks slots for a while only: each copy that ends
// leaves its source evictable, or frees it. WaitCopiesFrom lets the request
// wait for them instead of computing blocks it cannot cache, which would
// cost the next request with the same prefix its whole recompute.

// copyWaiter is one WaitCopiesFrom call waiting.
type copyWaiter struct {
	tier   Tier
	target uint64 // copiedFrom[tier] at which it wakes
	ch     chan struct{}
}

// WaitCopiesFrom waits until the copies reading tier t that ended since the
// call number n (at least 1; each left a block of t evictable, or freed its
// slot), or
// until no copy reads t, or until ctx is done. It reports whether it waited:
// false, at once, when no copy read t at the call. Then an Insert short of
// slots will not find more by waiting, and keeps what fits.
//
// The usual caller releases its partial Insert, waits for the slots it
// lacked, and inserts again while it waited.
func (m *Manager) WaitCopiesFrom(ctx context.Context, t Tier, n int) (bool, error) {
	if err := m.checkTier("WaitCopiesFrom", t); err != nil {
		return false, err
	}
	if n < 0 {
		return false, fmt.Errorf("%w: WaitCopiesFrom: n = %d, want at least 0", ErrBadInput, n)
	}
	m.lock()
	if m.copiesFrom[t] == 0 {
		m.unlock()
		return false, nil
	}
	w := copyWaiter{tier: t, target: m.copiedFrom[t] + uint64(max(n, 1)), ch: make(chan struct{})}
	m.copyWaiters = append(m.copyWaiters, w)
	m.unlock()
	select {
	case <-w.ch:
		return true, nil
	case <-ctx.Done():
		m.lock()
		m.copyWaiters = slices.DeleteFunc(m.copyWaiters, func(x copyWaiter) bool { return x.ch == w.ch })
		m.unlock()
		return true, ctx.Err()
	}
}

// copyEnded counts a copy out of tier t that ended, under the lock, and
// wakes the waiters whose count it reached.
func (m *Manager) copyEnded(t Tier) {
	m.copiesFrom[t]--
	m.copiedFrom[t]++
	if len(m.copyWaiters) == 0 {
		return
	}
	m.copyWaiters = slices.DeleteFunc(m.copyWaiters, func(w copyWaiter) bool {
		if w.tier != t || (m.copiedFrom[t] < w.target && m.copiesFrom[t] > 0) {
			return false
		}
		close(w.ch)
		return true
	})
}

// CopiesReading is how many copies in flight now read tier t's blocks: a
// caller short of slots in t that cannot block (a simulation) waits for
// them to end as WaitCopiesFrom would.
func (m *Manager) CopiesReading(t Tier) int {
	if t >= NumTiers {
		return 0
	}
	m.lock()
	defer m.unlock()
	return m.copiesFrom[t]
}

// Refused is how many of l's blocks Onboard turned to Recompute for want of
// a GPU slot (Why NoGPUSlot).
func (l *Lease) Refused() int {
	n := 0
	for i := range l.Blocks {
		if b := &l.Blocks[i]; b.Action == Recompute && b.Why == NoGPUSlot {
			n++
		}
	}
	return n
}

// RetryRefused sets the blocks Onboard refused for want of a GPU slot back
// to Load, as the Planner chose them, and returns how many: the next
// Onboard loads them where it finds slots. A caller short of slots waits
// for the copies out of the GPU first (WaitCopiesFrom), so that a block is
// not recomputed, and left uncached, only because a write-through copy
// still read the slot it needed. The Metrics count each refusal.
func (l *Lease) RetryRefused() int {
	n := 0
	for i := range l.Blocks {
		if b := &l.Blocks[i]; b.Action == Recompute && b.Why == NoGPUSlot {
			b.Action, b.Why = Load, Planned
			n++
		}
	}
	return n
}
