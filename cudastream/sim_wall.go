package cudastream

import "time"

// execute runs for the life of a wall-clock sim: it retires operations when
// the clock reaches their end, so data moves on its own goroutine, as DMA
// does, and waiters in Synchronize wake up. It sleeps until the next start or
// end on the timeline, or until new work is enqueued.
func (s *Sim) execute() {
	defer close(s.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		s.mu.Lock()
		now := s.nowLocked()
		s.advanceLocked(now)
		next, ok := s.nextEventLocked()
		s.mu.Unlock()
		var fire <-chan time.Time
		if ok {
			timer.Reset(max(next-now, 0))
			fire = timer.C
		}
		select {
		case <-s.stop:
			timer.Stop()
			return
		case <-s.kick:
		case <-fire:
		}
		timer.Stop()
	}
}
