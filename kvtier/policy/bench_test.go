package policy

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// benchKeys is a reproducible key stream: a Zipf-like mix so that Touch
// finds keys and Evict has work.
func benchKeys(n int, universe uint64) []uint64 {
	rng := rand.New(rand.NewPCG(5, 6))
	z := rand.NewZipf(rng, 1.1, 1, universe-1)
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = z.Uint64()
	}
	return keys
}

// BenchmarkTouch times Touch of resident keys in a full policy of 1<<20 keys.
func BenchmarkTouch(b *testing.B) {
	const capacity = 1 << 20
	keys := benchKeys(1<<16, capacity)
	for _, np := range allPolicies {
		b.Run(np.name, func(b *testing.B) {
			p := mustMake(b, np, capacity)
			for k := range uint64(capacity) {
				p.Insert(k, Meta{Bytes: 1, RecomputeSeconds: 1})
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				p.Touch(keys[i&(len(keys)-1)])
			}
		})
	}
}

// BenchmarkInsertEvict times one Evict and one Insert of a new key in a full
// policy, with no key in use and with one in 64 of the keys first inserted in
// use for the whole run: a worst case where pinned keys sit at the eviction
// end and every Evict walks past them.
func BenchmarkInsertEvict(b *testing.B) {
	for _, capacity := range []int{1 << 12, 1 << 20} {
		for _, busy := range []uint64{0, 64} {
			for _, np := range allPolicies {
				b.Run(fmt.Sprintf("%s/keys=%d/inuse=1in%d", np.name, capacity, busy), func(b *testing.B) {
					p := mustMake(b, np, capacity)
					for k := range uint64(capacity) {
						p.Insert(k, Meta{Bytes: 1, RecomputeSeconds: float64(1 + k%7)})
					}
					var evictable func(uint64) bool
					if busy > 0 {
						evictable = func(k uint64) bool { return k >= uint64(capacity) || k%busy != 0 }
					}
					next := uint64(capacity)
					b.ReportAllocs()
					b.ResetTimer()
					for b.Loop() {
						if _, ok := p.Evict(evictable); !ok {
							b.Fatal("nothing evictable")
						}
						p.Insert(next, Meta{Bytes: 1, RecomputeSeconds: float64(1 + next%7)})
						next++
					}
				})
			}
		}
	}
}

func BenchmarkSeenTwice(b *testing.B) {
	a, err := NewSeenTwice[uint64](1<<22, 1<<20, identity)
	if err != nil {
		b.Fatal(err)
	}
	keys := benchKeys(1<<16, 1<<24)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k := keys[i&(len(keys)-1)]
		a.Record(k)
		a.Admit(k)
	}
}

// BenchmarkLRUIndex compares the map index with the dense one on the same
// LRU[ref] of 1<<20 keys, called directly (the benchmarks above reach the
// dense policies through the tests' uint64 adapter, which adds an indirect
// call per key and per evictable call): Touch of resident keys, and Evict
// plus Insert of a new key with no key or one in 64 in use. New keys cycle
// through [1<<20, 4<<20), each long evicted when it comes round again, and
// the dense index is grown to 4<<20 before the timer starts, as it stops
// growing under the block manager, which reuses its BlockRefs.
func BenchmarkLRUIndex(b *testing.B) {
	const capacity = 1 << 20
	for _, ix := range []struct {
		name string
		make func(int) (*LRU[ref], error)
	}{{"map", NewLRU[ref]}, {"dense", NewDenseLRU[ref]}} {
		fill := func(b *testing.B) *LRU[ref] {
			p, err := ix.make(capacity)
			if err != nil {
				b.Fatal(err)
			}
			for k := range ref(capacity) {
				p.Insert(k, Meta{})
			}
			// Grow the dense index to the largest key once, as a block
			// manager's would have grown to its largest BlockRef.
			p.Insert(4*capacity-1, Meta{})
			p.Remove(4*capacity - 1)
			return p
		}
		b.Run(ix.name+"/touch", func(b *testing.B) {
			p := fill(b)
			keys := benchKeys(1<<16, capacity)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				p.Touch(ref(keys[i&(len(keys)-1)]))
			}
		})
		for _, busy := range []ref{0, 64} {
			b.Run(fmt.Sprintf("%s/insert-evict/inuse=1in%d", ix.name, busy), func(b *testing.B) {
				p := fill(b)
				var evictable func(ref) bool
				if busy > 0 {
					evictable = func(k ref) bool { return k >= capacity || k%busy != 0 }
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					if _, ok := p.Evict(evictable); !ok {
						b.Fatal("nothing evictable")
					}
					p.Insert(capacity+ref(i%(3*capacity)), Meta{})
				}
			})
		}
	}
}
