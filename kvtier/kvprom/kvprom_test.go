package kvprom

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/policy"
)

// TestCollectorReportsAManagersMetrics drives a real one-tier manager (2
// slots) and compares the exported series with what the operations imply.
func TestCollectorReportsAManagersMetrics(t *testing.T) {
	lru, err := policy.NewLRU[kvtier.BlockRef](2)
	if err != nil {
		t.Fatal(err)
	}
	var cfg kvtier.Config
	cfg.BlockTokens = 2
	cfg.Tiers[kvtier.Host] = kvtier.TierConfig{CapacityBytes: 2048, SlotBytes: 1024, Policy: lru}
	m, err := kvtier.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var l kvtier.Lease
	// Insert 3 blocks into 2 slots one request at a time: one eviction.
	for i := range int32(3) {
		if err := m.Insert(7, []int32{i, i}, kvtier.Host, &l); err != nil {
			t.Fatal(err)
		}
		if err := m.Commit(&l, nil); err != nil {
			t.Fatal(err)
		}
		m.Release(&l)
	}
	// A lookup of 2 blocks whose first is cached, held: 1 hit, 1 miss.
	if err := m.Lookup(7, []int32{2, 2, 9, 9}, &l); err != nil || l.Len() != 1 {
		t.Fatalf("lookup: %d blocks, %v", l.Len(), err)
	}
	defer m.Release(&l)

	c := New(m, "kvtier", prometheus.Labels{"model": "test"})
	want := `
# HELP kvtier_bytes_in_total Bytes written into the tier by completed copies and committed inserts.
# TYPE kvtier_bytes_in_total counter
kvtier_bytes_in_total{model="test",tier="host"} 3072
# HELP kvtier_capacity_blocks Slots of the tier.
# TYPE kvtier_capacity_blocks gauge
kvtier_capacity_blocks{model="test",tier="host"} 2
# HELP kvtier_dropped_touches_total Policy touches and admission records of lookups dropped because their stripe's queue was full (recency is then approximate).
# TYPE kvtier_dropped_touches_total counter
kvtier_dropped_touches_total{model="test"} 0
# HELP kvtier_evictions_total Blocks evicted from the tier to make room (demoted or dropped).
# TYPE kvtier_evictions_total counter
kvtier_evictions_total{model="test",tier="host"} 1
# HELP kvtier_hits_total Looked-up blocks served from the tier (their fastest ready tier).
# TYPE kvtier_hits_total counter
kvtier_hits_total{model="test",tier="host"} 1
# HELP kvtier_in_use_blocks Resident blocks of the tier held by a lease or a copy.
# TYPE kvtier_in_use_blocks gauge
kvtier_in_use_blocks{model="test",tier="host"} 1
# HELP kvtier_lookup_blocks_total Full blocks asked for by lookups.
# TYPE kvtier_lookup_blocks_total counter
kvtier_lookup_blocks_total{model="test"} 2
# HELP kvtier_misses_total Looked-up blocks the tier could not serve and no faster tier served.
# TYPE kvtier_misses_total counter
kvtier_misses_total{model="test",tier="host"} 1
# HELP kvtier_records Blocks known to the manager.
# TYPE kvtier_records gauge
kvtier_records{model="test"} 2
# HELP kvtier_resident_blocks Slots of the tier holding a block (being written, ready or being evicted).
# TYPE kvtier_resident_blocks gauge
kvtier_resident_blocks{model="test",tier="host"} 2
`
	names := []string{"kvtier_bytes_in_total", "kvtier_capacity_blocks", "kvtier_dropped_touches_total", "kvtier_evictions_total",
		"kvtier_hits_total", "kvtier_in_use_blocks", "kvtier_lookup_blocks_total", "kvtier_misses_total",
		"kvtier_records", "kvtier_resident_blocks"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	// 9 series and 5 refusal reasons for the one tier present, 10
	// manager-wide and 3 recompute reasons; none for gpu or nvme.
	if n := testutil.CollectAndCount(c); n != 27 {
		t.Fatalf("%d series, want 27", n)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
