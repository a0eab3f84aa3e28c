package kvtier

import "sync/atomic"

// TierMetrics are one tier's counters.
type TierMetrics struct {
	// Hits counts looked-up blocks served from this tier (their fastest
	// ready tier); Misses counts looked-up blocks this tier could not serve
	// because no faster tier did and it held no ready copy.
	Hits, Misses uint64
	// BytesIn and BytesOut count bytes copied into and out of the tier by
	// completed copies (and, for BytesIn, blocks committed after Insert).
	BytesIn, BytesOut uint64
	// Evictions counts blocks that left the tier to make room (demoted or
	// dropped); Demotions counts those among them copied to the next tier.
	Evictions, Demotions uint64
	// ResidentBlocks is the number of slots in use (being written, ready or
	// being evicted); InUseBlocks is how many of those blocks hold references.
	ResidentBlocks, InUseBlocks int64
	// CapacitySlots is the tier's slot count.
	CapacitySlots int64
}

// Metrics is a snapshot of the manager's counters.
type Metrics struct {
	Tiers [NumTiers]TierMetrics
	// Lookups counts Lookup and LookupKeys calls; LookupBlocks the full
	// blocks they asked for; HitBlocks those in the returned prefixes.
	Lookups, LookupBlocks, HitBlocks uint64
	// HoleBlocks counts the missing blocks lookups skipped to return
	// cached blocks after them (Config.MaxHoleBlocks).
	HoleBlocks uint64
	// Mismatches counts blocks whose key was found but whose salt, parent,
	// position or tokens differed (hash collisions, served as misses), or
	// that a token lookup found stored without tokens (by InsertKeys).
	Mismatches uint64
	// NoSpace counts slot allocations that failed (ErrNoSpace).
	NoSpace uint64
	// MoveFailures counts copies the Mover reported as failed.
	MoveFailures uint64
	// DroppedTouches counts policy touches and admission records of
	// lookups that were dropped because their stripe's queue was full
	// while another call held the lock (recency is then approximate).
	DroppedTouches uint64
	// Invalidations counts blocks Invalidate and InvalidateSalt forgot.
	Invalidations uint64
	// Recomputes counts, by reason, the blocks Onboard turned from Load to
	// Recompute (Block.Why says the same per block).
	Recomputes [NumReasons]uint64
	// Records is the number of blocks known to the manager.
	Records int64
}

type tierCounters struct {
	hits, misses, bytesIn, bytesOut, evictions, demotions atomic.Uint64
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
