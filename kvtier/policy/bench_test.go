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
				p.Insert(k, Meta{Bytes: 1, RecomputeCost: 1})
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
						p.Insert(k, Meta{Bytes: 1, RecomputeCost: float64(1 + k%7)})
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
						p.Insert(next, Meta{Bytes: 1, RecomputeCost: float64(1 + next%7)})
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
