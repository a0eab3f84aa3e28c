package kvtier

import "sync/atomic"

// TierMetrics are one tier's counters.
type TierMetrics struct {
	Hits, Misses   uint64 // looked-up blocks served from it (their fastest); not served by it or faster
	BytesIn        uint64 // bytes copied in, and committed by inserts
	BytesOut       uint64 // bytes copied out
	Evictions      uint64 // blocks that left it to make room (demoted or dropped)
	Demotions      uint64 // evictions copied to the next tier
	ResidentBlocks int64  // slots in use
	InUseBlocks    int64  // resident blocks referenced by a lease or a copy
	CapacitySlots  int64  // the tier's slots
	// Refused counts the copies into the tier the manager did not make, by
	// Refusal (its Admitter's and Gate's answers).
	Refused [NumRefusals]uint64
}

// Metrics is a snapshot of the manager's counters.
type Metrics struct {
	Tiers          [NumTiers]TierMetrics
	Lookups        uint64             // Lookup and LookupKeys calls
	LookupBlocks   uint64             // full blocks they asked for
	HitBlocks      uint64             // blocks in the prefixes they returned
	HoleBlocks     uint64             // missing blocks skipped (Config.MaxHoleBlocks)
	Mismatches     uint64             // key found, salt, parent, position or tokens differed: a miss
	NoSpace        uint64             // slot allocations that failed (ErrNoSpace)
	MoveFailures   uint64             // copies the Mover reported as failed
	DroppedTouches uint64             // lookups' policy touches dropped (recency then approximate)
	Invalidations  uint64             // blocks Invalidate and InvalidateSalt forgot
	Recomputes     [NumReasons]uint64 // loads Onboard turned into recomputes, by Reason
	Records        int64              // blocks known to the manager
}

type tierCounters struct {
	hits, misses, bytesIn, bytesOut, evictions, demotions atomic.Uint64
	refusals                                              [NumRefusals]atomic.Uint64
}

// counters are the live counters. A nil *counters counts nothing.
type counters struct {
	tiers                             [NumTiers]tierCounters
	lookups, lookupBlocks, hitBlocks  atomic.Uint64
	mismatches, noSpace, moveFailures atomic.Uint64
	droppedTouches                    atomic.Uint64
	invalidations, holes              atomic.Uint64
	recomputes                        [NumReasons]atomic.Uint64
}

// gauges are levels, not counts. resident changes only under the manager's
// write lock. (The in-use gauges also change in lookups and releases, under
// a stripe's read lock: they are atomic, kept per stripe in stripe.inUse.)
type gauges struct {
	resident [NumTiers]int64
}

func (c *counters) tier(t Tier) *tierCounters {
	if c == nil {
		return nil
	}
	return &c.tiers[t]
}

func (c *counters) lookup(blocks, hits int) {
	if c == nil {
		return
	}
	c.lookups.Add(1)
	c.lookupBlocks.Add(uint64(blocks))
	c.hitBlocks.Add(uint64(hits))
}

func (c *counters) mismatch() {
	if c != nil {
		c.mismatches.Add(1)
	}
}

func (c *counters) noSpaceHit() {
	if c != nil {
		c.noSpace.Add(1)
	}
}

func (c *counters) invalidated() {
	if c != nil {
		c.invalidations.Add(1)
	}
}

func (c *counters) recompute(why Reason) {
	if c != nil {
		c.recomputes[why].Add(1)
	}
}

func (c *counters) moveFailure() {
	if c != nil {
		c.moveFailures.Add(1)
	}
}

func (t *tierCounters) in(n int64) {
	if t != nil {
		t.bytesIn.Add(uint64(n))
	}
}
func (t *tierCounters) out(n int64) {
	if t != nil {
		t.bytesOut.Add(uint64(n))
	}
}
func (t *tierCounters) evicted() {
	if t != nil {
		t.evictions.Add(1)
	}
}
func (t *tierCounters) refused(why Refusal) {
	if t != nil {
		t.refusals[why].Add(1)
	}
}
func (t *tierCounters) demoted() {
	if t != nil {
		t.demotions.Add(1)
	}
}

// snapshot sums the stripes' counters; each is read atomically, the set
// is not. resident, inUse and records were read under the manager's lock.
func (m *Manager) snapshot(resident, inUse [NumTiers]int64, records int) Metrics {
	var mt Metrics
	for t := range NumTiers {
		mt.Tiers[t].CapacitySlots = int64(m.slots[t])
	}
	if m.metrics == nil {
		return mt
	}
	for i := range m.stripes {
		c := &m.stripes[i].c
		for t := range NumTiers {
			s, d := &c.tiers[t], &mt.Tiers[t]
			d.Hits += s.hits.Load()
			d.Misses += s.misses.Load()
			d.BytesIn += s.bytesIn.Load()
			d.BytesOut += s.bytesOut.Load()
			d.Evictions += s.evictions.Load()
			d.Demotions += s.demotions.Load()
			for r := range NumRefusals {
				d.Refused[r] += s.refusals[r].Load()
			}
		}
		mt.Lookups += c.lookups.Load()
		mt.LookupBlocks += c.lookupBlocks.Load()
		mt.HitBlocks += c.hitBlocks.Load()
		mt.Mismatches += c.mismatches.Load()
		mt.NoSpace += c.noSpace.Load()
		mt.MoveFailures += c.moveFailures.Load()
		mt.DroppedTouches += c.droppedTouches.Load()
		mt.Invalidations += c.invalidations.Load()
		mt.HoleBlocks += c.holes.Load()
		for w := range mt.Recomputes {
			mt.Recomputes[w] += c.recomputes[w].Load()
		}
	}
	for t := range NumTiers {
		mt.Tiers[t].ResidentBlocks, mt.Tiers[t].InUseBlocks = resident[t], inUse[t]
	}
	mt.Records = int64(records)
	return mt
}
