package kvtier

import (
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"kvtier.dev/kvtier/policy"
)

// benchManager is one GPU tier of slots 16-token blocks, already holding
// fill random blocks besides the 128-block request it returns.
func benchManager(b *testing.B, slots, fill int) (*Manager, []int32) {
	m := oneTier(b, GPU, slots, 16)
	rng := rand.New(rand.NewPCG(1, 1))
	req := make([]int32, 128*16)
	for i := range req {
		req[i] = rng.Int32N(128000)
	}
	insertReady(b, m, 1, req, GPU)
	other := make([]int32, 128*16)
	for n := 0; n < fill; n += 128 {
		for i := range other {
			other[i] = rng.Int32N(128000)
		}
		insertReady(b, m, 2, other, GPU)
	}
	return m, req
}

// BenchmarkLookup128 looks up a cached 128-block prefix of 16-token blocks:
// hashing, index probes, token verification, references, LRU touches and
// the release, with 1 million other blocks resident.
func BenchmarkLookup128(b *testing.B) {
	m, req := benchManager(b, 1<<21, 1<<20)
	b.Run("serial", func(b *testing.B) {
		var l Lease
		b.ReportAllocs()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cpu0, ok := threadCPU()
		n := 0
		for b.Loop() {
			if err := m.Lookup(1, req, &l); err != nil || l.Len() != 128 {
				b.Fatalf("%d hits, %v", l.Len(), err)
			}
			m.Release(&l)
			n++
		}
		if cpu1, ok1 := threadCPU(); ok && ok1 && n > 0 {
			b.ReportMetric(float64((cpu1-cpu0).Nanoseconds())/float64(n), "cpu-ns/op")
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			var l Lease
			for pb.Next() {
				if err := m.Lookup(1, req, &l); err != nil || l.Len() != 128 {
					b.Errorf("%d hits, %v", l.Len(), err)
					return
				}
				m.Release(&l)
			}
		})
	})
}

// BenchmarkInsertEvict inserts 16-token blocks into a full tier of 64Ki
// slots, each evicting the least recently used; reported per block.
func BenchmarkInsertEvict(b *testing.B) {
	const slots = 1 << 16
	m, _ := benchManager(b, slots, slots)
	rng := rand.New(rand.NewPCG(2, 2))
	req := make([]int32, 16*16)
	var l Lease
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 16 {
		for j := range req {
			req[j] = rng.Int32N(128000)
		}
		if err := m.Insert(3, req, GPU, &l); err != nil || l.Len() != 16 {
			b.Fatalf("%d inserted, %v", l.Len(), err)
		}
		if err := m.Commit(&l, nil); err != nil {
			b.Fatal(err)
		}
		m.Release(&l)
	}
	if ev := m.Metrics().Tiers[GPU].Evictions; ev == 0 && b.N > 16 {
		b.Fatal("no evictions")
	}
}

// nopPolicy tracks nothing; it lets the memory benchmark separate the
// manager's own metadata from its policy's.
type nopPolicy struct{ n int }

func (p *nopPolicy) Insert(BlockRef, policy.Meta)                    { p.n++ }
func (p *nopPolicy) Touch(BlockRef)                                  {}
func (p *nopPolicy) Remove(BlockRef)                                 { p.n-- }
func (p *nopPolicy) Evict(func(BlockRef) bool) (v BlockRef, ok bool) { return 0, false }
func (p *nopPolicy) Len() int                                        { return p.n }

// BenchmarkResident10M fills one tier with 10 million blocks (keys only, as
// a trace would: token ids are stored apart and not counted) and reports the
// heap bytes per resident block and the GC pause with them resident.
// Set KVTIER_BENCH_10M=1 to run it (about 1.5 GB of memory).
func BenchmarkResident10M(b *testing.B) {
	if os.Getenv("KVTIER_BENCH_10M") == "" {
		b.Skip("set KVTIER_BENCH_10M=1 to fill 10 million blocks")
	}
	const blocks = 10_000_000
	for _, pc := range []struct {
		name string
		new  func() policy.Policy[BlockRef]
	}{
		{"manager-only", func() policy.Policy[BlockRef] { return &nopPolicy{} }},
		{"with-LRU", func() policy.Policy[BlockRef] { return newLRU(b, blocks) }},
	} {
		b.Run(pc.name, func(b *testing.B) {
			for b.Loop() {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				var cfg Config
				cfg.BlockTokens = 16
				cfg.Tiers[Host] = TierConfig{CapacityBytes: blocks << 10, SlotBytes: 1 << 10, Policy: pc.new()}
				m := mustNew(b, cfg)
				keys := make([]Key, 128)
				rng := rand.New(rand.NewPCG(3, 3))
				var l Lease
				start := time.Now()
				for n := 0; n < blocks; n += len(keys) {
					for i := range keys {
						keys[i] = Key(rng.Uint64())
					}
					k := keys[:min(len(keys), blocks-n)]
					if err := m.InsertKeys(0, k, Host, &l); err != nil || l.Len() != len(k) {
						b.Fatalf("at %d: %d inserted, %v", n, l.Len(), err)
					}
					if err := m.Commit(&l, nil); err != nil {
						b.Fatal(err)
					}
					m.Release(&l)
				}
				fill := time.Since(start)
				runtime.GC()
				runtime.ReadMemStats(&after)
				var pauses []time.Duration
				for range 7 {
					var ms runtime.MemStats
					runtime.GC()
					runtime.ReadMemStats(&ms)
					pauses = append(pauses, time.Duration(ms.PauseNs[(ms.NumGC+255)%256]))
				}
				gcStart := time.Now()
				runtime.GC()
				gcWall := time.Since(gcStart)
				slices.Sort(pauses)
				if got := m.Metrics().Tiers[Host].ResidentBlocks; got != blocks {
					b.Fatalf("%d resident", got)
				}
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/blocks, "bytes/block")
				b.ReportMetric(float64(pauses[len(pauses)/2].Microseconds()), "median-gc-pause-us")
				b.ReportMetric(float64(pauses[len(pauses)-1].Microseconds()), "max-gc-pause-us")
				b.ReportMetric(float64(gcWall.Microseconds()), "gc-cycle-us")
				b.ReportMetric(float64(fill.Nanoseconds())/blocks, "fill-ns/block")
				runtime.KeepAlive(m)
			}
		})
	}
}
