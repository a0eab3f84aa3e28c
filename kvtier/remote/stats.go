package remote

import "sync/atomic"

// Stats counts what a Cache did. Misses = Absent + Incomplete + Corrupt +
// Refused + Failed.
type Stats struct {
	// Reads.
	Hits, Misses uint64
	// Absent: no header under the block's key. Incomplete: a header
	// without all its parts (the store evicted some); the rest is deleted.
	Absent, Incomplete uint64
	// Corrupt: a value whose header, identity or payload checksum did not
	// match the block asked for (a foreign or overwritten value); deleted.
	Corrupt uint64
	// Refused: reads the open breaker turned into misses at once. Failed:
	// reads the store did not answer in time or answered with an error.
	Refused, Failed uint64
	BytesRead       uint64

	// Writes. Queued: blocks Put accepted. Written: blocks stored.
	// Deduplicated: blocks not sent because the store had them already.
	Queued, Written, Deduplicated uint64
	// DroppedFull: Puts refused because every queue buffer was taken.
	// DroppedPending: Puts of a block already queued. DroppedOpen: writes
	// dropped because the breaker was open.
	DroppedFull, DroppedPending, DroppedOpen uint64
	// Rejected: writes the store refused for want of memory. WriteErrors:
	// writes that failed otherwise.
	Rejected, WriteErrors uint64
	BytesWritten          uint64

	// The breaker: times it opened and closed, and whether it is open now
	// (or half open, probing).
	BreakerOpens, BreakerCloses uint64
	BreakerOpen                 bool
}

type counters struct {
	hits, absent, incomplete, corrupt, refused, failed, bytesRead atomic.Uint64
	queued, written, dedup, dropFull, dropPending, dropOpen       atomic.Uint64
	rejected, writeErrs, bytesWritten                             atomic.Uint64
}

// Stats returns the counters so far.
func (c *Cache) Stats() Stats {
	s := &c.stats
	st := Stats{
		Hits: s.hits.Load(), Absent: s.absent.Load(), Incomplete: s.incomplete.Load(),
		Corrupt: s.corrupt.Load(), Refused: s.refused.Load(), Failed: s.failed.Load(),
		BytesRead: s.bytesRead.Load(),
		Queued:    s.queued.Load(), Written: s.written.Load(), Deduplicated: s.dedup.Load(),
		DroppedFull: s.dropFull.Load(), DroppedPending: s.dropPending.Load(), DroppedOpen: s.dropOpen.Load(),
		Rejected: s.rejected.Load(), WriteErrors: s.writeErrs.Load(), BytesWritten: s.bytesWritten.Load(),
	}
	st.Misses = st.Absent + st.Incomplete + st.Corrupt + st.Refused + st.Failed
	state, opens, closes := c.br.snapshot()
	st.BreakerOpens, st.BreakerCloses, st.BreakerOpen = opens, closes, state != closed
	return st
}
