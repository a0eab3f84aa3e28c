package engine

import "kvtier.dev/kvtier"

// prefetchers bounds the prefetches running at once.
const prefetchers = 4

// headLocked returns the request first in line if it has not been
// prefetched yet, and marks it; nil otherwise. e.mu is held.
func (e *Engine) headLocked() *seq {
	if len(e.queue) == 0 || e.queue[0].prefetched {
		return nil
	}
	e.queue[0].prefetched = true
	return e.queue[0]
}

// prefetch brings the NVMe blocks of s's cached prefix into the host tier,
// up to Config.PrefetchBlocks, in the background, while s waits for the
// GPU: its plan then loads them from the host tier instead of the drive.
// It does nothing when s is nil, the engine prefetches nothing, s takes no
// cache, or prefetchers are running already.
func (e *Engine) prefetch(s *seq) {
	m := e.cfg.Cache
	if s == nil || e.cfg.PrefetchBlocks == 0 || s.noCache || m == nil || m.CapacitySlots(kvtier.NVMe) == 0 || m.CapacitySlots(kvtier.Host) == 0 {
		return
	}
	select {
	case e.prefetchers <- struct{}{}:
	default:
		return
	}
	full := (len(s.req.Tokens) - 1) / e.bt
	go func() {
		defer func() { <-e.prefetchers }()
		n, err := m.Prefetch(s.req.Salt, s.req.Tokens[:full*e.bt], kvtier.Host, e.cfg.PrefetchBlocks)
		if err != nil {
			e.log.Debug("engine: prefetch", "request", s.req.ID, "err", err)
			return
		}
		e.prefetched.Add(float64(n))
	}()
}
