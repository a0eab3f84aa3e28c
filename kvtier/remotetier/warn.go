package remotetier

import (
	"errors"
	"sync"
	"time"

	"kvtier.dev/kvtier/remote"
)

// WarnEvery is the least time between two Warn lines of one reason: a
// store that is down fails every fetch, and one line every few seconds
// says so as well as thousands.
const WarnEvery = 10 * time.Second

// A failed fetch's reason, for its Warn line.
type warnReason int

const (
	warnUnavailable warnReason = iota // the store did not answer, or the breaker is open
	warnCorrupt                       // a value did not verify
	numWarnReasons
)

var warnMessages = [numWarnReasons]string{
	warnUnavailable: "remotetier: remote fetches fail: the store does not answer (or its breaker is open); the blocks are recomputed",
	warnCorrupt:     "remotetier: remote values did not verify (forged, another deployment's, or damaged): deleted and recomputed",
}

// warnings holds back repeated Warn lines.
type warnings struct {
	now  func() time.Time // nil: time.Now (tests set it)
	mu   sync.Mutex
	last [numWarnReasons]time.Time
	held [numWarnReasons]int // failures since the last line
}

// warnFetch logs a fetch's error at Warn if it is worth a line (an absent
// or incomplete block is not), at most once per reason every WarnEvery.
func (r *Tier) warnFetch(err error) {
	var why warnReason
	switch {
	case errors.Is(err, remote.ErrCorrupt):
		why = warnCorrupt
	case errors.Is(err, remote.ErrUnavailable):
		why = warnUnavailable
	default:
		return
	}
	w := &r.warn
	w.mu.Lock()
	w.held[why]++
	now := time.Now
	if w.now != nil {
		now = w.now
	}
	t := now()
	if !w.last[why].IsZero() && t.Sub(w.last[why]) < WarnEvery {
		w.mu.Unlock()
		return
	}
	n := w.held[why]
	w.held[why], w.last[why] = 0, t
	w.mu.Unlock()
	r.log.Warn(warnMessages[why], "blocks", n, "err", err)
}
