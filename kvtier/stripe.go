package kvtier

import (
	"runtime"
	"sync"
	"sync/atomic"

	"kvtier.dev/internal/invariants"
)

// The manager's lock and the state that lookups write are split into
// stripes, so that lookups on different cores write no cache line in
// common (the figures in BenchmarkLookup128):
//
//   - The lock is a big-reader lock: each stripe has its own RWMutex; a
//     lookup or a release read-locks its lease's stripe only, and a writer
//     locks every stripe in order. Writers pay one uncontended lock per
//     stripe; readers never touch another stripe's lock word.
//   - A lookup does not add a reference to each block it leases: it pins
//     its Lease in its stripe's list of active leases. Every write-locked
//     operation first turns the pins into references (materialize), so
//     that eviction and everything else under the write lock see exact
//     reference counts; a Release of a lease still pinned just unpins it.
//     A shared hot prefix is thus only read by the cores that look it up.
//   - Lookup counters and the in-use gauges are kept per stripe and summed
//     by Metrics.
//   - Policy touches and admission records from lookups go into the
//     stripe's bounded buffer (ristretto's approach) instead of taking the
//     write lock at Release. The policies and admitters have a lock of
//     their own, policyMu, which lookups never take (they do not read the
//     policies): the buffers are applied, in order per stripe, at the start
//     of every write-locked operation (which also holds policyMu), or by a
//     releaser that finds its buffer full and policyMu free, while lookups
//     go on. When the buffer is full and policyMu is busy, the touches are
//     dropped and counted (Metrics.DroppedTouches): recency is then
//     approximate, never wrong about what may be evicted (references
//     decide that).
//
// A Lease is bound to one stripe the first time it is used (round robin),
// so a server that keeps a Lease per worker spreads its workers over the
// stripes.

const (
	maxStripes  = 64
	touchBufLen = 256
)

// touch is a deferred policy touch of ref in tier, or, with tier NumTiers,
// an admission record of key. key guards against ref having been reused by
// another block by the time the touch is applied.
type touch struct {
	key  Key
	ref  BlockRef
	tier Tier
}

type stripe struct {
	mu     sync.RWMutex
	bufMu  sync.Mutex // guards active under mu's read lock, and n and buf
	active []*Lease   // pinned leases
	n      int        // touches in buf
	buf    [touchBufLen]touch
	c      counters // lookup counters; stripe 0's also count the writers'
	inUse  [NumTiers]atomic.Int64
	_      [64]byte // keeps the next stripe's lock off this stripe's lines
}

func stripeCount() int {
	n := max(runtime.GOMAXPROCS(0), runtime.NumCPU())
	s := 1
	for s < n && s < maxStripes {
		s <<= 1
	}
	return s
}

// stripeOf is l's stripe, binding l to one on its first use.
func (m *Manager) stripeOf(l *Lease) *stripe {
	if l.stripe == 0 {
		l.stripe = uint32(m.nextStripe.Add(1)) // never 0 again: 1-based
		if l.stripe == 0 {
			l.stripe = 1
		}
	}
	return &m.stripes[(l.stripe-1)&uint32(len(m.stripes)-1)]
}

// lock takes the manager's write lock: every stripe, in order, then
// policyMu (a releaser applying touches holds policyMu alone and waits for
// nothing, so the order cannot deadlock). It then turns the pinned leases
// into references and applies the touches lookups left in the stripes'
// buffers, so that every decision under the lock sees both.
func (m *Manager) lock() {
	for i := range m.stripes {
		m.stripes[i].mu.Lock()
	}
	m.policyMu.Lock()
	m.materialize()
	m.drainTouches()
}

func (m *Manager) unlock() {
	if e := m.events; e != nil && e.held {
		e.release()
	}
	m.policyMu.Unlock()
	for i := len(m.stripes) - 1; i >= 0; i-- {
		m.stripes[i].mu.Unlock()
	}
}

// rlock read-locks one stripe: enough to read every record, the index and
// the tiers, which change only under the write lock.
func (m *Manager) rlock(s *stripe) { s.mu.RLock() }

func (m *Manager) runlock(s *stripe) { s.mu.RUnlock() }

// stripeCounters returns s's lookup counters, nil when metrics are off.
func (m *Manager) stripeCounters(s *stripe) *counters {
	if m.metrics == nil {
		return nil
	}
	return &s.c
}

// pushTouches queues ts in s's buffer. Called without the lock. When the
// buffer is full it applies it if policyMu is free now (its own stripe
// only, so that policyMu is held for one buffer's touches at most there),
// and otherwise drops what does not fit.
func (m *Manager) pushTouches(s *stripe, ts []touch) {
	for len(ts) > 0 {
		s.bufMu.Lock()
		k := copy(s.buf[s.n:], ts)
		s.n += k
		s.bufMu.Unlock()
		ts = ts[k:]
		if k > 0 && !m.touchPending.Load() {
			m.touchPending.Store(true)
		}
		if len(ts) == 0 {
			return
		}
		if !m.policyMu.TryLock() {
			if m.metrics != nil {
				s.c.droppedTouches.Add(uint64(len(ts)))
			}
			return
		}
		m.drainStripe(s)
		m.policyMu.Unlock()
	}
}

// drainTouches applies the touches queued in every stripe, in order per
// stripe. Called with policyMu held, and maybe no stripe: it reads the
// records and the index, which only the write lock changes (and a writer
// holds policyMu too), and writes only the policies, the admitters and the
// records' touch stamps.
func (m *Manager) drainTouches() {
	if !m.touchPending.Load() {
		return
	}
	// A touch pushed after its stripe was read sets the flag again: the
	// flag is cleared before the reads, and set after each push.
	m.touchPending.Store(false)
	for i := range m.stripes {
		m.drainStripe(&m.stripes[i])
	}
}

// drainStripe applies the touches queued in s. Called as drainTouches.
func (m *Manager) drainStripe(s *stripe) {
	s.bufMu.Lock()
	n := copy(m.drainBuf[:], s.buf[:s.n])
	s.n = 0
	s.bufMu.Unlock()
	m.applyTouches(m.drainBuf[:n])
}

func (m *Manager) applyTouches(ts []touch) {
	for _, t := range ts {
		if t.tier == NumTiers {
			m.recordAccess(t.key)
			continue
		}
		if uint32(t.ref) >= m.recs.n {
			continue
		}
		r := m.recs.at(t.ref)
		// The block may have left the tier, or its record been reused,
		// since the lookup.
		if r.key == t.key && r.state[t.tier] == stateReady {
			m.policyTouch(t.tier, t.ref)
		}
	}
}

// recent reports whether ref was inserted into or touched in tier t's
// policy within its last window operations: it then lies among the window
// most recent keys of an LRU, and a new touch is skipped (as memcached
// skips bumping items bumped in the last minute). Called under any lock;
// the stamps change under policyMu, so they are read atomically.
func (m *Manager) recent(t Tier, r *record) bool {
	return m.ticks[t].Load()-atomic.LoadUint32(&r.touched[t]) < m.tiers[t].window
}

// policyTouch touches ref in tier t's policy and stamps it. policyMu.
func (m *Manager) policyTouch(t Tier, ref BlockRef) {
	r := m.recs.at(ref)
	m.policyOf(t, r).Touch(ref)
	atomic.StoreUint32(&r.touched[t], m.ticks[t].Add(1)-1)
}

// policyInsert inserts ref into tier t's policy and stamps it. Write lock.
func (m *Manager) policyInsert(t Tier, ref BlockRef) {
	r := m.recs.at(ref)
	m.policyOf(t, r).Insert(ref, m.meta(t, r))
	atomic.StoreUint32(&r.touched[t], m.ticks[t].Add(1)-1)
}

// pin records that l holds references on its blocks without writing them.
// Called with st read-locked, st being l's stripe.
func (m *Manager) pin(st *stripe, l *Lease) {
	st.bufMu.Lock()
	l.activeAt = len(st.active)
	st.active = append(st.active, l)
	st.bufMu.Unlock()
	l.pinned = true
}

// unpin forgets l's pin. Called with st read-locked, st being l's stripe.
func (m *Manager) unpin(st *stripe, l *Lease) {
	st.bufMu.Lock()
	last := len(st.active) - 1
	if l.activeAt > last || st.active[l.activeAt] != l {
		st.bufMu.Unlock()
		invariants.Failf("a pinned lease is not in its stripe's list")
	}
	moved := st.active[last]
	st.active[l.activeAt] = moved
	moved.activeAt = l.activeAt
	st.active[last] = nil
	st.active = st.active[:last]
	st.bufMu.Unlock()
	l.pinned = false
}

// materialize turns every pinned lease's pin into references on its
// blocks. Called under the write lock (no reader holds a stripe).
func (m *Manager) materialize() {
	for i := range m.stripes {
		st := &m.stripes[i]
		for j, l := range st.active {
			for k := range l.Blocks {
				m.ref(l.Blocks[k].Ref)
			}
			l.pinned = false
			st.active[j] = nil
		}
		st.active = st.active[:0]
	}
}
