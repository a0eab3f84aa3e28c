package kvprom

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/policy"
)

// TestTenantsCollector drives a one-tier manager of 2 slots with one
// tenant capped at 1 slot, and another salt, and compares the series.
func TestTenantsCollector(t *testing.T) {
	lru, err := policy.NewDenseLRU[kvtier.BlockRef](2)
	if err != nil {
		t.Fatal(err)
	}
	var cfg kvtier.Config
	cfg.BlockTokens = 2
	cfg.Tiers[kvtier.Host] = kvtier.TierConfig{CapacityBytes: 2048, SlotBytes: 1024, Policy: lru,
		NewPolicy: func(n int) (policy.Policy[kvtier.BlockRef], error) { return policy.NewDenseLRU[kvtier.BlockRef](n) }}
	cfg.Tenants = []kvtier.TenantLimit{{Name: "acme", Salt: 7, Slots: [kvtier.NumTiers]int{kvtier.Host: 1}, Weight: 2}}
	m, err := kvtier.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var l kvtier.Lease
	// acme inserts 2 blocks in turn into its 1 slot (one eviction), salt 9
	// one; then acme looks up its last block (a hit) and the first (a miss);
	// a Pin is no lookup.
	for _, w := range []struct {
		salt kvtier.Salt
		tok  int32
	}{{7, 1}, {7, 2}, {9, 3}} {
		if err := m.Insert(w.salt, []int32{w.tok, w.tok}, kvtier.Host, &l); err != nil {
			t.Fatal(err)
		}
		if err := m.Commit(&l, nil); err != nil {
			t.Fatal(err)
		}
		m.Release(&l)
	}
	for _, tok := range []int32{2, 1} {
		if err := m.Lookup(7, []int32{tok, tok}, &l); err != nil {
			t.Fatal(err)
		}
		m.Release(&l)
	}
	if _, err := m.Pin(9, []int32{3, 3}, kvtier.MaxPriority, time.Time{}); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP kvtier_pinned_blocks Blocks pinned (Manager.Pin) and not expired at the last eviction.
# TYPE kvtier_pinned_blocks gauge
kvtier_pinned_blocks 1
# HELP kvtier_tenant_cap_blocks The tenant's cap of the tier's slots (0: none).
# TYPE kvtier_tenant_cap_blocks gauge
kvtier_tenant_cap_blocks{tenant="acme",tier="host"} 1
kvtier_tenant_cap_blocks{tenant="other",tier="host"} 0
# HELP kvtier_tenant_evictions_total The tenant's blocks evicted from the tier.
# TYPE kvtier_tenant_evictions_total counter
kvtier_tenant_evictions_total{tenant="acme",tier="host"} 1
kvtier_tenant_evictions_total{tenant="other",tier="host"} 0
# HELP kvtier_tenant_hit_tokens_total Tokens of the blocks the tenant's lookups returned.
# TYPE kvtier_tenant_hit_tokens_total counter
kvtier_tenant_hit_tokens_total{tenant="acme"} 2
kvtier_tenant_hit_tokens_total{tenant="other"} 0
# HELP kvtier_tenant_lookup_blocks_total Full blocks the tenant's lookups asked for.
# TYPE kvtier_tenant_lookup_blocks_total counter
kvtier_tenant_lookup_blocks_total{tenant="acme"} 2
kvtier_tenant_lookup_blocks_total{tenant="other"} 0
# HELP kvtier_tenant_resident_blocks Slots of the tier holding the tenant's blocks.
# TYPE kvtier_tenant_resident_blocks gauge
kvtier_tenant_resident_blocks{tenant="acme",tier="host"} 1
kvtier_tenant_resident_blocks{tenant="other",tier="host"} 1
# HELP kvtier_tenant_bytes_in_total Bytes of the tenant's blocks written into the tier.
# TYPE kvtier_tenant_bytes_in_total counter
kvtier_tenant_bytes_in_total{tenant="acme",tier="host"} 2048
kvtier_tenant_bytes_in_total{tenant="other",tier="host"} 1024
`
	c := Tenants(m, "kvtier", nil)
	names := []string{"kvtier_pinned_blocks", "kvtier_tenant_cap_blocks", "kvtier_tenant_evictions_total",
		"kvtier_tenant_hit_tokens_total", "kvtier_tenant_lookup_blocks_total", "kvtier_tenant_resident_blocks",
		"kvtier_tenant_bytes_in_total"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n, err := testutil.CollectAndLint(c); err != nil || len(n) > 0 {
		t.Errorf("lint: %v %v", n, err)
	}
}
