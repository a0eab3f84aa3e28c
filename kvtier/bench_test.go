package kvtier

import (
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"kvtier.dev/kvtier/policy"
)

// benchManager is one GPU tier of slots 16-token blocks, already holding
// fill random blocks (as 128-block requests of salt 2, returned in others)
// besides the 128-block request of salt 1 it returns.
func benchManager(b *testing.B, slots, fill int) (m *Manager, req []int32, others [][]int32) {
	m = oneTier(b, GPU, slots, 16)
	rng := rand.New(rand.NewPCG(1, 1))
	req = make([]int32, 128*16)
	for i := range req {
		req[i] = rng.Int32N(128000)
	}
	insertReady(b, m, 1, req, GPU)
	for n := 0; n < fill; n += 128 {
		other := make([]int32, 128*16)
		for i := range other {
			other[i] = rng.Int32N(128000)
		}
		insertReady(b, m, 2, other, GPU)
		others = append(others, other)
	}
	return m, req, others
}

// BenchmarkLookup128 looks up a cached 128-block prefix of 16-token blocks:
// hashing, index probes, token verification, references, LRU touches and
// the release, with 1 million other blocks resident. ns/op of the parallel
// cases is wall time over all goroutines' operations (so perfect scaling
// halves it at -cpu 2); cpu-ns/op is CPU time per operation (the thread's
// for serial, the process's for parallel), which a loaded machine does not
// inflate.
//
//   - serial: one goroutine, the same prefix every time (a hot prefix).
//   - serial-spread: one goroutine, a random prefix among the 8192 resident
//     ones each time (cold caches; recency touches are due).
//   - parallel/shared: every goroutine the same prefix (a shared system
//     prompt): the blocks' reference counts are written by every core.
//   - parallel/distinct: each goroutine its own hot prefix.
//   - parallel/spread: each goroutine a random resident prefix each time.
func BenchmarkLookup128(b *testing.B) {
	m, req, others := benchManager(b, 1<<21, 1<<20)
	salts := func(i int) Salt { return 2 }
	check := func(b *testing.B, l *Lease, err error) bool {
		if err != nil || l.Len() != 128 {
			b.Errorf("%d hits, %v", l.Len(), err)
			return false
		}
		return true
	}
	serial := func(b *testing.B, next func() (Salt, []int32)) {
		var l Lease
		b.ReportAllocs()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cpu0, ok := threadCPU()
		n := 0
		for b.Loop() {
			salt, tok := next()
			if err := m.Lookup(salt, tok, &l); !check(b, &l, err) {
				return
			}
			m.Release(&l)
			n++
		}
		if cpu1, ok1 := threadCPU(); ok && ok1 && n > 0 {
			b.ReportMetric(float64((cpu1-cpu0).Nanoseconds())/float64(n), "cpu-ns/op")
		}
	}
	b.Run("serial", func(b *testing.B) {
		serial(b, func() (Salt, []int32) { return 1, req })
	})
	b.Run("serial-spread", func(b *testing.B) {
		rng := rand.New(rand.NewPCG(5, 5))
		serial(b, func() (Salt, []int32) {
			i := rng.IntN(len(others))
			return salts(i), others[i]
		})
	})
	parallel := func(b *testing.B, pick func(g int, rng *rand.Rand) (Salt, []int32)) {
		var goroutines atomic.Int32
		b.ReportAllocs()
		dropped0 := m.Metrics().DroppedTouches
		cpu0, ok := processCPU()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			g := int(goroutines.Add(1)) - 1
			rng := rand.New(rand.NewPCG(7, uint64(g)))
			var l Lease
			for pb.Next() {
				salt, tok := pick(g, rng)
				if err := m.Lookup(salt, tok, &l); !check(b, &l, err) {
					return
				}
				m.Release(&l)
			}
		})
		b.StopTimer()
		if cpu1, ok1 := processCPU(); ok && ok1 && b.N > 0 {
			b.ReportMetric(float64((cpu1-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		}
		// Lookup touches the policy could not take (the lock was busy
		// and the stripe's queue full): recency lost, not correctness.
		b.ReportMetric(float64(m.Metrics().DroppedTouches-dropped0)/float64(b.N), "dropped-touches/op")
	}
	b.Run("parallel/shared", func(b *testing.B) {
		parallel(b, func(int, *rand.Rand) (Salt, []int32) { return 1, req })
	})
	b.Run("parallel/distinct", func(b *testing.B) {
		parallel(b, func(g int, _ *rand.Rand) (Salt, []int32) {
			i := g % len(others)
			return salts(i), others[i]
		})
	})
	b.Run("parallel/spread", func(b *testing.B) {
		parallel(b, func(_ int, rng *rand.Rand) (Salt, []int32) {
			i := rng.IntN(len(others))
			return salts(i), others[i]
		})
	})
	if mt := m.Metrics(); mt.Mismatches != 0 {
		b.Fatalf("%d mismatches", mt.Mismatches)
	}
}

// BenchmarkInsertEvict inserts 16-token blocks into a full tier of 64Ki
// slots, each evicting the least recently used; reported per block.
func BenchmarkInsertEvict(b *testing.B) {
	const slots = 1 << 16
	m, _, _ := benchManager(b, slots, slots)
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
// heap bytes per resident block and the GC pause with them resident: with
// no policy, with the dense LRU the manager is meant to run with, and with
// the map-indexed LRU for comparison. Set KVTIER_BENCH_10M=1 to run it (about 1.5 GB of memory).
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
		{"with-LRU", func() policy.Policy[BlockRef] { return newLRU(b, blocks) }}, // NewDenseLRU
		{"with-map-LRU", func() policy.Policy[BlockRef] {
			p, err := policy.NewLRU[BlockRef](blocks)
			if err != nil {
				b.Fatal(err)
			}
			return p
		}},
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
