package kvtier

import (
	"fmt"
	"time"
)

// Pinning is retention with one priority level: a pinned block is evicted
// from a tier only when no unpinned block there is evictable (for a tenant
// at its cap: none of its own), so pins never make a tier refuse a block it
// could otherwise hold. A pin lasts until its time limit, if it has one, or
// until Unpin; a later Pin of the block replaces the limit. Expiry is lazy:
// the limits are read when a pinned tier evicts or Pinned is called. A
// block that leaves every tier (evicted when only pins were left, or
// invalidated) loses its pin.

// pins are the pinned blocks. Write lock.
type pins struct {
	until map[BlockRef]time.Time // zero: no limit
	next  time.Time              // earliest limit among them; zero: none
	now   func() time.Time
}

// Pin pins the cached blocks of tokens' prefix (salt's) in every tier that
// holds them, until the time until (zero: until Unpin), and returns how
// many. Pinning is not a use: no policy touch, admission record or lookup
// counted. (Not to be confused with a lease's pin in its stripe.)
func (m *Manager) Pin(salt Salt, tokens []int32, until time.Time) (int, error) {
	var l Lease
	if err := m.checkPin("Pin", until, &l); err != nil {
		return 0, err
	}
	m.pinLookup(salt, nil, tokens, &l)
	return m.pinLease(&l, true, until), nil
}

// PinKeys is Pin for callers that computed the block keys themselves.
func (m *Manager) PinKeys(salt Salt, keys []Key, until time.Time) (int, error) {
	var l Lease
	if err := m.checkPin("PinKeys", until, &l); err != nil {
		return 0, err
	}
	m.pinLookup(salt, keys, nil, &l)
	return m.pinLease(&l, true, until), nil
}

// Unpin unpins the cached blocks of tokens' prefix (salt's) and returns
// how many were pinned.
func (m *Manager) Unpin(salt Salt, tokens []int32) (int, error) {
	var l Lease
	if err := m.begin(&l); err != nil {
		return 0, err
	}
	m.pinLookup(salt, nil, tokens, &l)
	return m.pinLease(&l, false, time.Time{}), nil
}

// UnpinKeys is Unpin for callers that computed the block keys themselves.
func (m *Manager) UnpinKeys(salt Salt, keys []Key) (int, error) {
	var l Lease
	if err := m.begin(&l); err != nil {
		return 0, err
	}
	m.pinLookup(salt, keys, nil, &l)
	return m.pinLease(&l, false, time.Time{}), nil
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
	n := len(m.pins.until)
	m.unlock()
	return n
}

func (m *Manager) checkPin(op string, until time.Time, l *Lease) error {
	if now := m.pins.now(); !until.IsZero() && !until.After(now) {
		return fmt.Errorf("%w: %s: until %v is not after now (%v)", ErrBadInput, op, until, now)
	}
	return m.begin(l)
}

// pinLease pins (on) or unpins l's blocks and releases l without recording
// its lookup. It returns how many blocks it pinned, or unpinned.
func (m *Manager) pinLease(l *Lease, on bool, until time.Time) int {
	l.lookup = false
	n := 0
	m.lock()
	for i := range l.Blocks {
		ref := l.Blocks[i].Ref
		r := m.recs.at(ref)
		switch {
		case on:
			if m.pins.until == nil {
				m.pins.until = make(map[BlockRef]time.Time)
			}
			r.flags |= flagPinned
			m.pins.until[ref] = until
			if !until.IsZero() && (m.pins.next.IsZero() || until.Before(m.pins.next)) {
				m.pins.next = until
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
	m.recs.at(ref).flags &^= flagPinned
	delete(m.pins.until, ref)
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
	for ref, until := range m.pins.until {
		switch {
		case until.IsZero():
		case !now.Before(until):
			m.unpinBlock(ref)
		case m.pins.next.IsZero() || until.Before(m.pins.next):
			m.pins.next = until
		}
	}
}
