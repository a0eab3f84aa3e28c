package kvtier

import (
	"fmt"
	"math"

	"kvtier.dev/kvtier/policy"
)

// TenantLimit bounds one tenant, the blocks of one salt, in the tiers.
type TenantLimit struct {
	// Name labels the tenant in metrics (kvprom's tenant label); "" is the
	// salt in hex. DefaultTenant names the other salts and is refused.
	Name string
	// Salt is the salt the tenant's blocks carry: what its Lookups and
	// Inserts pass (stack.Cache.Salt of the tenant's request salt).
	Salt Salt
	// Slots[t] caps the slots the tenant's blocks hold in tier t, in any
	// state; 0 is no cap. At its cap, the tenant's next block in t takes
	// the slot of one of its own victims, and fails (ErrNoSpace) when none
	// of its blocks there is evictable. Example: {GPU: 4096} keeps it to
	// 4,096 GPU slots however many are free.
	Slots [NumTiers]int
	// Weight is the tenant's share of a contended tier. When a tier is
	// full and the block placed is not of a tenant at its cap, the victim
	// comes from the group whose resident blocks per unit of weight are the
	// most (the default group weighs 1). Example: weight 3 against the
	// default group alone holds three quarters of a tier both fill. > 0.
	Weight float64
}

// DefaultTenant is the name, in TenantMetrics and metrics labels, of the
// salts that Config.Tenants does not list.
const DefaultTenant = "other"

// tenants is the manager's per-tenant eviction: one group per configured
// tenant, each with a policy per tier, and group 0 for every other salt on
// the tiers' own policies.
type tenants struct {
	index  map[Salt]int32 // configured salt -> its group
	groups []group        // [0]: the default group
	order  []int32        // victim's scratch: groups by weighted share
}

type group struct {
	name     string
	salt     Salt
	weight   float64
	cap      [NumTiers]int64 // 0: none
	policy   [NumTiers]policy.Policy[BlockRef]
	resident [NumTiers]int64 // slots held (any state); write lock
	c        tenantCounters
}

func (c *Config) validateTenants(slots [NumTiers]uint32) error {
	if len(c.Tenants) == 0 {
		return nil
	}
	for t := range NumTiers {
		if slots[t] > 0 && c.Tiers[t].NewPolicy == nil {
			return configErr(fmt.Sprintf("Tiers[%v].NewPolicy", t), "is nil but %d Tenants are configured", len(c.Tenants))
		}
	}
	salts := make(map[Salt]int, len(c.Tenants))
	names := make(map[string]int, len(c.Tenants))
	for i, tl := range c.Tenants {
		field := func(f string) string { return fmt.Sprintf("Tenants[%d].%s", i, f) }
		if j, dup := salts[tl.Salt]; dup {
			return configErr(field("Salt"), "%#x is also Tenants[%d]'s", uint64(tl.Salt), j)
		}
		salts[tl.Salt] = i
		name := tenantName(tl)
		if name == DefaultTenant {
			return configErr(field("Name"), "%q names the salts not listed", name)
		}
		if j, dup := names[name]; dup {
			return configErr(field("Name"), "%q is also Tenants[%d]'s", name, j)
		}
		names[name] = i
		if !(tl.Weight > 0) || math.IsInf(tl.Weight, 1) {
			return configErr(field("Weight"), "%v is not a positive number", tl.Weight)
		}
		for t := range NumTiers {
			n := tl.Slots[t]
			switch {
			case n < 0:
				return configErr(field(fmt.Sprintf("Slots[%v]", t)), "%d is negative", n)
			case n > 0 && slots[t] == 0:
				return configErr(field(fmt.Sprintf("Slots[%v]", t)), "%d slots in the %v tier, which is absent", n, t)
			case int64(n) > int64(slots[t]):
				return configErr(field(fmt.Sprintf("Slots[%v]", t)), "%d is more than the %v tier's %d slots", n, t, slots[t])
			}
		}
	}
	return nil
}

func tenantName(tl TenantLimit) string {
	if tl.Name != "" {
		return tl.Name
	}
	return fmt.Sprintf("%#x", uint64(tl.Salt))
}

// newTenants makes the groups of cfg (validated), nil without Tenants.
func newTenants(cfg *Config, slots [NumTiers]uint32) (*tenants, error) {
	if len(cfg.Tenants) == 0 {
		return nil, nil
	}
	ten := &tenants{
		index:  make(map[Salt]int32, len(cfg.Tenants)),
		groups: make([]group, len(cfg.Tenants)+1),
		order:  make([]int32, 0, len(cfg.Tenants)+1),
	}
	def := &ten.groups[0]
	def.name, def.weight = DefaultTenant, 1
	for t := range NumTiers {
		def.policy[t] = cfg.Tiers[t].Policy
	}
	for i, tl := range cfg.Tenants {
		g := &ten.groups[i+1]
		g.name, g.salt, g.weight = tenantName(tl), tl.Salt, tl.Weight
		ten.index[tl.Salt] = int32(i + 1)
		for t := range NumTiers {
			if slots[t] == 0 {
				continue
			}
			g.cap[t] = int64(tl.Slots[t])
			room := int(slots[t])
			if tl.Slots[t] > 0 {
				room = tl.Slots[t]
			}
			p, err := cfg.Tiers[t].NewPolicy(room)
			field := fmt.Sprintf("Tiers[%v].NewPolicy", t)
			if err != nil {
				return nil, configErr(field, "for Tenants[%d]: %v", i, err)
			}
			if p == nil {
				return nil, configErr(field, "returned nil for Tenants[%d]", i)
			}
			for o := range ten.groups[:i+1] {
				if q := ten.groups[o].policy[t]; q != nil && samePolicy(q, p) {
					return nil, configErr(field, "returned one policy twice (Tenants[%d])", i)
				}
			}
			g.policy[t] = p
		}
	}
	return ten, nil
}

// of is salt's group.
func (ten *tenants) of(salt Salt) int32 {
	return ten.index[salt] // absent: 0, the default group
}

// policyOf is the policy that tracks r in tier t.
func (m *Manager) policyOf(t Tier, r *record) policy.Policy[BlockRef] {
	if m.ten == nil {
		return m.tiers[t].policy
	}
	return m.ten.groups[m.ten.of(r.salt)].policy[t]
}

// atCap returns the group of salt if it holds its cap of tier t's slots,
// or -1.
func (m *Manager) atCap(t Tier, salt Salt) int32 {
	if m.ten == nil {
		return -1
	}
	g := m.ten.of(salt)
	gr := &m.ten.groups[g]
	if gr.cap[t] > 0 && gr.resident[t] >= gr.cap[t] {
		return g
	}
	return -1
}

// victim picks and forgets tier t's next victim: from group own's policy
// when own >= 0 (a tenant at its cap), otherwise from the groups by
// weighted share, largest first; from the lowest retention priority that
// has an evictable block (pin.go).
func (m *Manager) victim(t Tier, own int32) (BlockRef, bool) {
	ts := &m.tiers[t]
	if m.ten == nil && len(m.pins.of) == 0 {
		return ts.policy.Evict(ts.evictable)
	}
	m.expirePins()
	if len(m.pins.of) > 0 {
		for p, n := range &m.pins.resident[t] { // no copy of the array
			if n == 0 && p != DefaultPriority {
				continue
			}
			m.pins.level = p
			if v, ok := m.victimAmong(t, own, ts.atLevel); ok {
				return v, true
			}
		}
	}
	return m.victimAmong(t, own, ts.evictable)
}

func (m *Manager) victimAmong(t Tier, own int32, evictable func(BlockRef) bool) (BlockRef, bool) {
	if m.ten == nil {
		return m.tiers[t].policy.Evict(evictable)
	}
	gs := m.ten.groups
	if own >= 0 {
		return gs[own].policy[t].Evict(evictable)
	}
	for _, g := range m.ten.byShare(t) {
		if v, ok := gs[g].policy[t].Evict(evictable); ok {
			return v, true
		}
	}
	return 0, false
}

// byShare orders the groups holding slots of tier t by resident blocks per
// unit of weight, largest first (ties: the lower index), into ten.order.
func (ten *tenants) byShare(t Tier) []int32 {
	o := ten.order[:0]
	share := func(g int32) float64 { return float64(ten.groups[g].resident[t]) / ten.groups[g].weight }
	for g := range ten.groups {
		if ten.groups[g].resident[t] == 0 {
			continue
		}
		o = append(o, int32(g))
		for j := len(o) - 1; j > 0 && share(o[j]) > share(o[j-1]); j-- {
			o[j], o[j-1] = o[j-1], o[j]
		}
	}
	ten.order = o
	return o
}

// tenantResident keeps the group of ref's salt counting its slots in tier
// t as ref's state there goes from none (d = 1) or to none (d = -1).
func (m *Manager) tenantResident(r *record, t Tier, d int64) {
	m.ten.groups[m.ten.of(r.salt)].resident[t] += d
}
