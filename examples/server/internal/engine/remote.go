package engine

import (
	"context"
	"time"

	"kvtier.dev/kvtier"
)

// defaultRemoteTimeout bounds a request's remote fetch when
// Config.RemoteTimeout is 0.
const defaultRemoteTimeout = time.Second

// startFetch starts, off the scheduler's goroutine, the remote fetch of s's
// cached prefix (the full blocks before its last position's): the blocks
// the local tiers lack come from the remote tier into the host tier, where
// s's lookup then finds them. s is not prefilled before the fetch ends
// (Config.RemoteTimeout at most); the requests behind it that need no
// fetch, and every decode step, go on meanwhile. It does nothing without
// a remote tier or for a request that takes no cache.
func (e *Engine) startFetch(s *seq) {
	r := e.cfg.Remote
	if r == nil || s.noCache {
		return
	}
	s.fetched = make(chan struct{})
	timeout := e.cfg.RemoteTimeout
	if timeout <= 0 {
		timeout = defaultRemoteTimeout
	}
	cached := s.req.Tokens[:(len(s.req.Tokens)-1)/e.bt*e.bt]
	go func() {
		defer e.signal()
		defer close(s.fetched)
		ctx, cancel := context.WithTimeout(s.ctx, timeout)
		defer cancel()
		m := e.cfg.Cache
		var l kvtier.Lease
		if err := m.Lookup(s.req.Salt, cached, &l); err != nil {
			e.log.Warn("engine: remote fetch: lookup", "request", s.req.ID, "err", err)
			return
		}
		// Remote misses, timeouts and failures are counted and logged by
		// the tier (remotetier: Warn); what Fetch returns is a lease it
		// cannot use.
		if _, err := r.Fetch(ctx, s.req.Salt, cached, &l); err != nil {
			e.log.Warn("engine: remote fetch", "request", s.req.ID, "err", err)
		}
		m.Release(&l)
	}()
}

// fetchDone reports whether s may prefill: its remote fetch, if any, has
// ended.
func (s *seq) fetchDone() bool {
	if s.fetched == nil {
		return true
	}
	select {
	case <-s.fetched:
		return true
	default:
		return false
	}
}
