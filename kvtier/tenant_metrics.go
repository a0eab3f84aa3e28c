package kvtier

import "sync/atomic"

// TenantMetrics are one tenant's counters (Manager.TenantMetrics).
type TenantMetrics struct {
	Name   string // TenantLimit.Name (its salt in hex if unnamed), or DefaultTenant
	Salt   Salt   // 0 for DefaultTenant
	Weight float64
	// Lookups, the full blocks they asked for, and the blocks (and their
	// tokens) in the prefixes they returned.
	Lookups, LookupBlocks, HitBlocks, HitTokens uint64
	Tiers                                       [NumTiers]TenantTierMetrics
}

// TenantTierMetrics are one tenant's counters in one tier.
type TenantTierMetrics struct {
	Hits           uint64 // looked-up blocks served from the tier (their fastest)
	BytesIn        uint64 // bytes copied in, and committed by inserts
	BytesOut       uint64 // bytes copied out
	Evictions      uint64 // blocks that left the tier to make room, or by Evict
	ResidentBlocks int64  // slots its blocks hold
	CapSlots       int64  // TenantLimit.Slots; 0: no cap
}

type tenantCounters struct {
	lookups, lookupBlocks, hitBlocks atomic.Uint64
	tiers                            [NumTiers]tierCounters
}

// tenantTier returns the counters of r's tenant in tier t, nil (which
// counts nothing) without tenants or metrics.
func (m *Manager) tenantTier(r *record, t Tier) *tierCounters {
	if m.ten == nil || m.metrics == nil {
		return nil
	}
	return &m.ten.groups[m.ten.of(r.salt)].c.tiers[t]
}

// countTenantLookup adds a lookup of salt to its tenant's counters. Called
// under a stripe's read lock (the groups change only in New).
func (m *Manager) countTenantLookup(salt Salt, blocks int, hits *[NumTiers]uint64) {
	c := &m.ten.groups[m.ten.of(salt)].c
	c.lookups.Add(1)
	c.lookupBlocks.Add(uint64(blocks))
	total := uint64(0)
	for t, n := range hits {
		if n > 0 {
			c.tiers[t].hits.Add(n)
			total += n
		}
	}
	c.hitBlocks.Add(total)
}

// TenantMetrics returns each configured tenant's counters, in
// Config.Tenants order, then DefaultTenant's (the salts not listed); nil
// without Config.Tenants. Counters are zero with Config.DisableMetrics.
func (m *Manager) TenantMetrics() []TenantMetrics {
	if m.ten == nil {
		return nil
	}
	gs := m.ten.groups
	out := make([]TenantMetrics, len(gs))
	at := func(g int) *TenantMetrics { return &out[(g+len(gs)-1)%len(gs)] } // group 0 last
	m.lock()
	for g := range gs {
		for t := range NumTiers {
			at(g).Tiers[t].ResidentBlocks, at(g).Tiers[t].CapSlots = gs[g].resident[t], gs[g].cap[t]
		}
	}
	m.unlock()
	for g := range gs {
		c, o := &gs[g].c, at(g)
		o.Name, o.Salt, o.Weight = gs[g].name, gs[g].salt, gs[g].weight
		o.Lookups, o.LookupBlocks, o.HitBlocks = c.lookups.Load(), c.lookupBlocks.Load(), c.hitBlocks.Load()
		o.HitTokens = o.HitBlocks * uint64(m.blockTokens)
		for t := range NumTiers {
			s, d := &c.tiers[t], &o.Tiers[t]
			d.Hits, d.BytesIn, d.BytesOut, d.Evictions = s.hits.Load(), s.bytesIn.Load(), s.bytesOut.Load(), s.evictions.Load()
		}
	}
	return out
}
