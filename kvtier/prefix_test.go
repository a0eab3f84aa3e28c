package kvtier

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"kvtier.dev/internal/invariants"
)

// TestCachedPrefixIsWhatLookupLeases: over random residency in three tiers,
// with holes, CachedPrefix reports per tier exactly the blocks the next
// Lookup leases, by their fastest tier, and each tier's leading run. Blocks
// of 2 tokens take the path that hashes the keys first; of 4 and 5 (a last
// half word), the one that hashes them in the walk, and prompts of up to 80
// blocks cross its batches.
func TestCachedPrefixIsWhatLookupLeases(t *testing.T) {
	for _, c := range []struct{ bt, holes, maxBlocks int }{
		{2, 0, 10}, {2, 2, 10}, {4, 0, 80}, {4, 2, 80}, {5, 3, 80},
	} {
		bt, holes := c.bt, c.holes
		f := newFakeMover()
		cfg := Config{BlockTokens: bt, Mover: f, MaxHoleBlocks: holes}
		cfg.Tiers[GPU] = tierCfg(t, 8*c.maxBlocks/10)
		cfg.Tiers[Host] = tierCfg(t, 16*c.maxBlocks/10)
		cfg.Tiers[NVMe] = tierCfg(t, 32*c.maxBlocks/10)
		m := mustNew(t, cfg)
		rng := rand.New(rand.NewPCG(uint64(holes), uint64(bt)))
		mixed, holed := 0, 0 // answers from two tiers or more; with a hole
		docs := make([][]int32, 6)
		for i := range docs {
			docs[i] = make([]int32, bt*(2+rng.IntN(c.maxBlocks-2))+rng.IntN(2)) // a partial last block, sometimes
			for j := range docs[i] {
				docs[i][j] = int32(rng.IntN(3))
			}
		}
		for step := range 300 {
			doc, salt := docs[rng.IntN(len(docs))], Salt(rng.IntN(2))
			tier := Tier(rng.IntN(int(NumTiers)))
			from := rng.IntN(len(doc)/bt) * bt // a prefix, to make holes in slower tiers
			insertReady(t, m, salt, doc[:from+bt*(rng.IntN((len(doc)-from)/bt)+1)], tier)
			f.drain()
			if rng.IntN(4) == 0 {
				_, _ = m.Invalidate(salt, doc[:bt*(1+rng.IntN(len(doc)/bt))])
			}
			for _, d := range docs {
				for s := range Salt(2) {
					got := m.CachedPrefix(s, d)
					var l Lease
					if err := m.Lookup(s, d, &l); err != nil {
						t.Fatal(err)
					}
					var want PrefixInfo
					want.Blocks = len(d) / bt
					for _, b := range l.Blocks {
						want.Cached[b.Tier] += bt
					}
					m.Release(&l)
					keys := m.keysOf(s, d)
					for tier := range NumTiers {
						for i := 0; i < want.Blocks; i++ {
							bi, ok := m.Peek(s, keys[i])
							if !ok || !bi.Ready[tier] {
								break
							}
							want.Prefix[tier] += bt
						}
					}
					tiers := 0
					for _, c := range want.Cached {
						tiers += min(c, 1)
					}
					mixed += min(tiers/2, 1)
					if got.CachedTokens() > max(got.Prefix[GPU], got.Prefix[Host], got.Prefix[NVMe]) && tiers == 1 {
						holed++
					}
					if got != want {
						t.Fatalf("%d-token blocks, holes %d, step %d: CachedPrefix %+v, the lookup and Peek say %+v", bt, holes, step, got, want)
					}
					if k := m.CachedPrefixKeys(s, keys); k != want {
						t.Fatalf("%d-token blocks, holes %d, step %d: CachedPrefixKeys %+v, the lookup and Peek say %+v", bt, holes, step, k, want)
					}
				}
			}
		}
		if mixed == 0 || (holes > 0 && holed == 0) {
			t.Errorf("%d-token blocks, holes %d: %d answers from two tiers or more, %d past a hole: the test exercised too little", bt, holes, mixed, holed)
		}
	}
}

// keysOf is the chained keys of tokens' full blocks.
func (m *Manager) keysOf(salt Salt, tokens []int32) []Key {
	h, _ := NewHasher(m.blockTokens)
	return h.AppendKeys(nil, salt, 0, tokens)
}

// TestCachedPrefixHasNoSideEffect: the query leases nothing, counts
// nothing and touches no policy: the block it asked about is still the
// LRU's victim.
func TestCachedPrefixHasNoSideEffect(t *testing.T) {
	m := oneTier(t, GPU, 2, 2)
	old, other := toks(1, 2, 10), toks(1, 2, 20)
	insertReady(t, m, 1, old, GPU)
	insertReady(t, m, 1, other, GPU)
	before := m.Metrics()
	if p := m.CachedPrefix(1, old); p.Cached[GPU] != 2 || p.Prefix[GPU] != 2 || p.CachedTokens() != 2 {
		t.Fatalf("CachedPrefix of a resident block: %+v", p)
	}
	if p := m.CachedPrefixKeys(1, m.keysOf(1, old)); p.Cached[GPU] != 2 {
		t.Fatalf("CachedPrefixKeys of a resident block: %+v", p)
	}
	if after := m.Metrics(); after != before {
		t.Fatalf("metrics changed:\n%+v\n%+v", before, after)
	}
	insertReady(t, m, 1, toks(1, 2, 30), GPU) // evicts the least recently used
	if p := m.CachedPrefix(1, old); p.CachedTokens() != 0 {
		t.Fatalf("the queried block was not the LRU victim: %+v", p)
	}
	if p := m.CachedPrefix(1, other); p.CachedTokens() != 2 {
		t.Fatalf("the other block was evicted: %+v", p)
	}
	if p := m.CachedPrefix(2, other); p.CachedTokens() != 0 {
		t.Fatalf("another salt's query found %+v", p)
	}
	if p := m.CachedPrefix(1, nil); p != (PrefixInfo{}) {
		t.Fatalf("an empty request: %+v", p)
	}
}

// TestCachedPrefixCollisionIsAMiss: b's first block takes a's key (the
// test hook), so the index finds a's record for it under the same salt,
// parent and position; its tokens' hash tells them apart, as Lookup's
// compare of the tokens does. A's own query still hits.
func TestCachedPrefixCollisionIsAMiss(t *testing.T) {
	m := oneTier(t, Host, 16, 4)
	a, b := toks(2, 4, 0), toks(2, 4, 100)
	ka, kb := m.keysOf(1, a), m.keysOf(1, b)
	m.testKeyHook = func(k Key) Key {
		if k == kb[0] {
			return ka[0]
		}
		return k
	}
	insertReady(t, m, 1, a, Host)
	if p := m.CachedPrefix(1, b); p.CachedTokens() != 0 || p.Prefix[Host] != 0 {
		t.Fatalf("a block whose key collides with a cached one, its tokens not: %+v", p)
	}
	if n := lookupLen(t, m, 1, b); n != 0 {
		t.Fatalf("Lookup leased %d colliding blocks", n)
	}
	if p := m.CachedPrefix(1, a); p.Cached[Host] != 8 || p.Prefix[Host] != 8 {
		t.Fatalf("the cached prompt: %+v", p)
	}
	m.check(t)
}

// TestCachedPrefixTokensStoredLater: blocks stored by key alone are no hit
// of a query by tokens (nor of a Lookup); once an Insert with tokens adds
// them, their hash is in the index and the query finds them.
func TestCachedPrefixTokensStoredLater(t *testing.T) {
	m := oneTier(t, Host, 8, 2)
	a := toks(3, 2, 0)
	var l Lease
	if err := m.InsertKeys(5, m.keysOf(5, a), Host, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(&l, nil); err != nil {
		t.Fatal(err)
	}
	m.Release(&l)
	if p := m.CachedPrefix(5, a); p.CachedTokens() != 0 {
		t.Fatalf("blocks stored without tokens: %+v", p)
	}
	if p := m.CachedPrefixKeys(5, m.keysOf(5, a)); p.Cached[Host] != 6 {
		t.Fatalf("the same blocks by key: %+v", p)
	}
	insertReady(t, m, 5, a, Host)
	if p := m.CachedPrefix(5, a); p.Cached[Host] != 6 {
		t.Fatalf("after their tokens were stored: %+v", p)
	}
	m.check(t)
}

// TestCheckCatchesAWrongTokenHash: the invariant walk fails on an index
// entry whose token hash is not its record's tokens'.
func TestCheckCatchesAWrongTokenHash(t *testing.T) {
	m := oneTier(t, Host, 8, 2)
	a := toks(2, 2, 0)
	insertReady(t, m, 1, a, Host)
	m.check(t)
	e := m.index.entry(indexKey(1, m.keysOf(1, a)[1]))
	e.tokens++
	defer func() {
		b, _ := recover().(*invariants.Broken)
		if b == nil || !strings.Contains(b.Msg, "token hash") {
			t.Fatalf("the walk's failure: %v", b)
		}
	}()
	m.check(t)
}

// TestCachedPrefixAllocatesNothing once its scratch is warm (not under the
// race detector, whose sync.Pool drops items at random).
func TestCachedPrefixAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	m := oneTier(t, GPU, 512, 16)
	req := toks(256, 16, 0)
	insertReady(t, m, 1, req, GPU)
	m.CachedPrefix(1, req)
	if n := testing.AllocsPerRun(100, func() { m.CachedPrefix(1, req) }); n != 0 {
		t.Fatalf("%v allocations per query", n)
	}
}

// BenchmarkCachedPrefix4K asks about a 4096-token prompt (256 blocks of 16
// tokens) cached in the GPU tier, with 1 million other blocks resident,
// on one goroutine locked to its thread; p99-ns is the 99th percentile of
// the queries' times.
func BenchmarkCachedPrefix4K(b *testing.B) {
	m, _, _ := benchManager(b, 1<<21, 1<<20)
	rng := rand.New(rand.NewPCG(4, 4))
	req := make([]int32, 4096)
	for i := range req {
		req[i] = rng.Int32N(128000)
	}
	insertReady(b, m, 3, req, GPU)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	times := make([]time.Duration, 0, 1<<20)
	b.ReportAllocs()
	for b.Loop() {
		t0 := time.Now()
		p := m.CachedPrefix(3, req)
		d := time.Since(t0)
		if p.Cached[GPU] != 4096 {
			b.Fatalf("%+v", p)
		}
		if len(times) < cap(times) {
			times = append(times, d)
		}
	}
	slices.Sort(times)
	if n := len(times); n > 0 {
		b.ReportMetric(float64(times[n*99/100].Nanoseconds()), "p99-ns")
		b.ReportMetric(float64(times[n/2].Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(times[n*90/100].Nanoseconds()), "p90-ns")
		b.ReportMetric(float64(times[n*95/100].Nanoseconds()), "p95-ns")
		b.ReportMetric(float64(times[n*98/100].Nanoseconds()), "p98-ns")
	}
}

// BenchmarkCachedPrefixKeys4K is BenchmarkCachedPrefix4K's walk alone:
// the keys are hashed once, before the loop.
func BenchmarkCachedPrefixKeys4K(b *testing.B) {
	m, _, _ := benchManager(b, 1<<21, 1<<20)
	rng := rand.New(rand.NewPCG(4, 4))
	req := make([]int32, 4096)
	for i := range req {
		req[i] = rng.Int32N(128000)
	}
	insertReady(b, m, 3, req, GPU)
	keys := m.keysOf(3, req)
	for b.Loop() {
		if p := m.CachedPrefixKeys(3, keys); p.Cached[GPU] != 4096 {
			b.Fatalf("%+v", p)
		}
	}
}
