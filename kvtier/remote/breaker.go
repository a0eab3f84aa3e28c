package remote

import (
	"sync"
	"time"
)

// breaker turns the tier off while the store fails and back on when it
// answers again. Closed, every call goes through; Failures consecutive
// failures open it. Open, calls are refused (reads miss at once, writes are
// dropped) for Cooldown; then one call goes through as a probe (half open):
// its success closes the breaker, its failure opens it for another Cooldown.
// A probe that has not reported after probeLimit is taken as lost and the
// next call probes in its place: a call that hangs (a write has no
// deadline of its own, only the store's connection timeouts) must not keep
// the tier off for good. A lost probe that reports later still counts.
type breaker struct {
	failures   int
	cooldown   time.Duration
	probeLimit time.Duration
	now        func() time.Time

	mu       sync.Mutex
	state    breakerState
	fails    int
	openedAt time.Time
	probing  bool
	probedAt time.Time
	opens    uint64
	closes   uint64
}

type breakerState uint8

const (
	closed breakerState = iota
	open
	halfOpen
)

func (s breakerState) String() string {
	switch s {
	case closed:
		return "closed"
	case open:
		return "open"
	}
	return "half-open"
}

func newBreaker(failures int, cooldown, probeLimit time.Duration, now func() time.Time) *breaker {
	return &breaker{failures: failures, cooldown: cooldown, probeLimit: probeLimit, now: now}
}

// allow reports whether a call may go to the store now. A true answer in
// the half-open state makes the caller the probe: it MUST report its
// outcome with success or failure.
func (b *breaker) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case closed:
		return true
	case open:
		if b.now().Sub(b.openedAt) < b.cooldown {
			return false
		}
		b.state = halfOpen
	default: // half open
		if b.probing && b.now().Sub(b.probedAt) < b.probeLimit {
			return false
		}
	}
	b.probing, b.probedAt = true, b.now()
	return true
}

func (b *breaker) success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != closed {
		b.closes++
	}
	b.state, b.fails, b.probing = closed, 0, false
}

func (b *breaker) failure() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fails++
	if b.state == halfOpen || (b.state == closed && b.fails >= b.failures) {
		b.state, b.openedAt, b.probing = open, b.now(), false
		b.opens++
	}
}

func (b *breaker) snapshot() (s breakerState, opens, closes uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state, b.opens, b.closes
}
