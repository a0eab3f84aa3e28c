package policy

import (
	"runtime"
	"testing"
)

// TestMemoryPerKey measures the heap each policy holds per tracked key at
// 1<<20 keys (uint64), slab, heap and map included, and bounds it: the block
// manager budgets 128 bytes of metadata per resident block in all.
func TestMemoryPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates about 100 MiB")
	}
	const n = 1 << 20
	for _, tc := range []struct {
		np    namedPolicy
		limit float64 // bytes per key
	}{
		// Measured 60, 72, 118 and 84 (Go 1.26, amd64): the map from key to
		// node is most of it, and TwoQ and S3FIFO size slab and map for their
		// ghost keys too (50% and 90% of capacity).
		{allPolicies[0], 64}, {allPolicies[1], 80}, {allPolicies[2], 128}, {allPolicies[3], 96},
		// The dense variants (uint32 keys, a slice instead of the map):
		// measured 20, 30, 38 and 52, a 16-byte node and a 4-byte index
		// entry per key, plus the ghost keys and the heap.
		{allPolicies[4], 24}, {allPolicies[5], 36}, {allPolicies[6], 44}, {allPolicies[7], 60},
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		p := mustMake(t, tc.np, n)
		for k := range uint64(n) {
			p.Insert(k, Meta{Bytes: 1})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perKey := float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(p)
		t.Logf("%s: %.1f bytes per key at %d keys", tc.np.name, perKey, n)
		if perKey > tc.limit {
			t.Errorf("%s: %.1f bytes per key, want at most %.0f", tc.np.name, perKey, tc.limit)
		}
	}
}
