package kvtier

import (
	"fmt"
	"time"
)

// Pinning is retention by priority, as TensorRT-LLM's retention config has
// it: a block has a priority in [0, MaxPriority], DefaultPriority unless
// pinned, and a tier evicts from its lowest priority first: a block of
// priority p goes only when no block of a lower priority is evictable
// there (for a tenant at its cap: none of its own); within a priority, the
// tier's policy and the tenants' shares choose. Pins never make a tier
// refuse a block it could otherwise hold. A pin below DefaultPriority
// makes its blocks go before unpinned ones (a document read once).
//
// A pin lasts until its time limit, if it has one, or until Unpin; then the
// block is back at DefaultPriority. A later Pin of the block replaces its
// priority and limit. Expiry is lazy: the limits are read when a pinned
// tier evicts or Pinned is called. A block that leaves every tier (evicted,
// or invalidated) loses its pin.
const (
	// DefaultPriority is an unpinned block's (TensorRT-LLM's default too).
	DefaultPriority = 35
	// MaxPriority is the highest priority: its blocks go last.
	MaxPriority = 100
)

// pin is one pinned block's retention.
type pin struct {
	until    time.Time // zero: no limit
	priority uint8
}

// pins are the pinned blocks. Write lock.
type pins struct {
	of     map[BlockRef]pin
	levels [MaxPriority + 1]int32 // pinned blocks per priority
	// resident[t][p]: pinned blocks of priority p that hold tier t (state
	// not none), so that a tier's eviction tries only the priorities it
	// holds: a priority with none there would cost a walk of its policy.
	resident [NumTiers][MaxPriority + 1]int32
	next     time.Time // earliest limit among them; zero: none
	now      func() time.Time
	level    int // the priority victim is taking now (atLevel)
}

// priorityOf is r's (ref's) priority.
func (m *Manager) priorityOf(ref BlockRef, r *record) int {
	if r.flags&flagPinned == 0 {
		return DefaultPriority
	}
	return int(m.pins.of[ref].priority)
}

// Pin gives the cached blocks of tokens' prefix (salt's), in every tier
// that holds them, the retention priority in [0, MaxPriority] until the
// time until (zero: until Unpin), and returns how many. Pinning is not a
// use: no policy touch, admission record or lookup counted. (Not to be
// confused with a lease's pin in its stripe.)
func (m *Manager) Pin(salt Salt, tokens []int32, priority int, until time.Time) (int, error) {
	var l Lease
	if err := m.checkPin("Pin", priority, until, &l); err != nil {
		return 0, err
	}
	m.pinLookup(salt, nil, tokens, &l)
	return m.pinLease(&l, true, pin{until: until, priority: uint8(priority)}), nil
}

// PinKeys is Pin for callers that computed the block keys themselves.
func (m *Manager) PinKeys(salt Salt, keys []Key, priority int, until time.Time) (int, error) {
	var l Lease
	if err := m.checkPin("PinKeys", priority, until, &l); err != nil {
		return 0, err
	}
	m.pinLookup(salt, keys, nil, &l)
	return m.pinLease(&l, true, pin{until: until, priority: uint8(priority)}), nil
}

// Unpin unpins the cached blocks of tokens' prefix (salt's) and returns
// how many were pinned.
func (m *Manager) Unpin(salt Salt, tokens []int32) (int, error) {
	var l Lease
	if err := m.begin(&l); err != nil {
		return 0, err
	}
	m.pinLookup(salt, nil, tokens, &l)
	return m.pinLease(&l, false, pin{}), nil
}

// UnpinKeys is Unpin for callers that computed the block keys themselves.
func (m *Manager) UnpinKeys(salt Salt, keys []Key) (int, error) {
	var l Lease
	if err := m.begin(&l); err != nil {
		return 0, err
	}
	m.pinLookup(salt, keys, nil, &l)
	return m.pinLease(&l, false, pin{}), nil
}

// pinLookup leases the cached prefix of keys (nil: tokens' keys) into l,
// begun, without counting the lookup.
func (m *Manager) pinLookup(salt Salt, keys []Key, tokens []int32, l *Lease) {
	if keys == nil {
		l.keys, l.buf = appendKeys(l.keys[:0], l.buf, m.blockTokens, salt, 0, tokens)
		m.hook(l.keys)
		keys = l.keys
	}
	l.quiet = true
	m.lookup(salt, keys, tokens, l)
}

// Pinned returns the number of blocks pinned now (limits past are expired
// first).
func (m *Manager) Pinned() int {
	m.lock()
	m.expirePins()
	n := len(m.pins.of)
	m.unlock()
	return n
}

// PinnedAt returns the number of blocks pinned now at each priority.
func (m *Manager) PinnedAt() [MaxPriority + 1]int {
	var n [MaxPriority + 1]int
	m.lock()
	m.expirePins()
	for p, c := range m.pins.levels {
		n[p] = int(c)
	}
	m.unlock()
	return n
}

func (m *Manager) checkPin(op string, priority int, until time.Time, l *Lease) error {
	if priority < 0 || priority > MaxPriority {
		return fmt.Errorf("%w: %s: priority %d is not in [0, %d]", ErrBadInput, op, priority, MaxPriority)
	}
	if now := m.pins.now(); !until.IsZero() && !until.After(now) {
		return fmt.Errorf("%w: %s: until %v is not after now (%v)", ErrBadInput, op, until, now)
	}
	return m.begin(l)
}

// pinLease pins (on) or unpins l's blocks and releases l without recording
// its lookup. It returns how many blocks it pinned, or unpinned.
func (m *Manager) pinLease(l *Lease, on bool, p pin) int {
	l.lookup = false
	n := 0
	m.lock()
	for i := range l.Blocks {
		ref := l.Blocks[i].Ref
		r := m.recs.at(ref)
		switch {
		case on:
			if m.pins.of == nil {
				m.pins.of = make(map[BlockRef]pin)
			}
			if r.flags&flagPinned != 0 {
				m.countPin(ref, r, -1)
			}
			r.flags |= flagPinned
			m.pins.of[ref] = p
			m.countPin(ref, r, 1)
			if !p.until.IsZero() && (m.pins.next.IsZero() || p.until.Before(m.pins.next)) {
				m.pins.next = p.until
			}
			n++
		case r.flags&flagPinned != 0:
			m.unpinBlock(ref)
			n++
		}
	}
	m.unlockAndSubmit(nil)
	m.Release(l)
	return n
}

// unpinBlock forgets ref's pin. (pins.next may then be early: expirePins
// finds nothing due and moves it on.)
func (m *Manager) unpinBlock(ref BlockRef) {
	r := m.recs.at(ref)
	m.countPin(ref, r, -1)
	r.flags &^= flagPinned
	delete(m.pins.of, ref)
}

// countPin adds d to the counts of ref's pin: its priority's, and its
// priority's in each tier ref holds.
func (m *Manager) countPin(ref BlockRef, r *record, d int32) {
	p := m.pins.of[ref].priority
	m.pins.levels[p] += d
	for t, s := range r.state {
		if s != stateNone {
			m.pins.resident[t][p] += d
		}
	}
}

// expirePins unpins the blocks whose limit has passed: one comparison while
// none is due, a walk of the pins when one is.
func (m *Manager) expirePins() {
	if m.pins.next.IsZero() {
		return
	}
	now := m.pins.now()
	if now.Before(m.pins.next) {
		return
	}
	m.pins.next = time.Time{}
	for ref, p := range m.pins.of {
		switch {
		case p.until.IsZero():
		case !now.Before(p.until):
			m.unpinBlock(ref)
		case m.pins.next.IsZero() || p.until.Before(m.pins.next):
			m.pins.next = p.until
		}
	}
}
