package policy

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"kvtier.dev/internal/invariants"
)

// allPolicies builds each policy over uint64 keys, with a map index, and
// over dense keys, with a slice index.
var allPolicies = append(slices.Clip(tracePolicies), densePolicies...)

func TestConstructorsRejectBadArguments(t *testing.T) {
	hash := func(k uint64) uint64 { return k }
	for _, tc := range []struct {
		name, arg string
		err       error
	}{
		{"NewLRU(0)", "capacity", second(NewLRU[uint64](0))},
		{"NewLRU(-1)", "capacity", second(NewLRU[uint64](-1))},
		{"NewTwoQ(0)", "capacity", second(NewTwoQ[uint64](0))},
		{"NewTwoQ(huge)", "capacity", second(NewTwoQ[uint64](1 << 31))},
		{"NewS3FIFO(0)", "capacity", second(NewS3FIFO[uint64](0))},
		{"NewS3FIFO(-5)", "capacity", second(NewS3FIFO[uint64](-5))},
		{"NewCostAware(0,1)", "capacity", second(NewCostAware[uint64](0, 1))},
		{"NewCostAware(1,0)", "decayCalls", second(NewCostAware[uint64](1, 0))},
		{"NewSeenTwice(0,1,h)", "counters", second(NewSeenTwice[uint64](0, 1, hash))},
		{"NewSeenTwice(64,0,h)", "window", second(NewSeenTwice[uint64](64, 0, hash))},
		{"NewSeenTwice(64,1,nil)", "hash", second(NewSeenTwice[uint64](64, 1, nil))},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		if !errors.Is(tc.err, ErrInvalidArgument) || !strings.Contains(tc.err.Error(), tc.arg+" = ") {
			t.Errorf("%s: error %q does not name %s or wrap ErrInvalidArgument", tc.name, tc.err, tc.arg)
		}
	}
}

func second[T any](_ T, err error) error { return err }

func mustMake(t testing.TB, np namedPolicy, capacity int) tracker {
	t.Helper()
	p, err := np.make(capacity)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestInvariants runs the contract of Policy against every policy.
func TestInvariants(t *testing.T) {
	for _, np := range allPolicies {
		t.Run(np.name, func(t *testing.T) {
			p := mustMake(t, np, 8)
			if _, ok := p.Evict(nil); ok || p.Len() != 0 {
				t.Fatalf("empty policy evicted something or Len %d", p.Len())
			}
			p.Remove(42) // absent: no-op
			p.Touch(42)  // absent: no-op
			if p.Len() != 0 || p.Contains(42) {
				t.Fatalf("Remove/Touch of an absent key changed the policy: Len %d", p.Len())
			}
			const n = 100
			for k := range uint64(n) {
				p.Insert(k, Meta{Bytes: 1})
				p.Insert(k, Meta{Bytes: 1}) // again: a touch, not a second key
				if p.Len() != int(k)+1 {
					t.Fatalf("after inserting %d keys Len is %d", k+1, p.Len())
				}
			}
			for k := uint64(0); k < n; k += 3 {
				p.Touch(k)
			}
			p.Remove(7)
			p.Remove(7)
			p.Remove(1000)
			if p.Len() != n-1 || p.Contains(7) {
				t.Fatalf("after Remove Len %d, Contains(7) %v", p.Len(), p.Contains(7))
			}
			// Keys 0..9 are in use: never evicted, still tracked at the end.
			inUse := func(k uint64) bool { return k >= 10 }
			seen := map[uint64]bool{7: true}
			for p.Len() > 9 {
				v, ok := p.Evict(inUse)
				if !ok {
					t.Fatalf("Evict found nothing with %d keys, %d evictable", p.Len(), p.Len()-9)
				}
				if v < 10 || seen[v] {
					t.Fatalf("evicted %d (in use or evicted before)", v)
				}
				seen[v] = true
			}
			if v, ok := p.Evict(inUse); ok {
				t.Fatalf("evicted %d while every key is in use", v)
			}
			for k := range uint64(10) {
				if k != 7 && !p.Contains(k) {
					t.Fatalf("in-use key %d lost", k)
				}
			}
			// Release them: each is evicted exactly once.
			for p.Len() > 0 {
				v, ok := p.Evict(nil)
				if !ok || seen[v] {
					t.Fatalf("Evict = %d, %v; seen before %v", v, ok, seen[v])
				}
				seen[v] = true
			}
			if len(seen) != n {
				t.Fatalf("%d distinct keys evicted or removed, want %d", len(seen), n)
			}
			if _, ok := p.Evict(nil); ok {
				t.Fatal("evicted from an empty policy")
			}
		})
	}
}

// TestRandomOperationsKeepContract applies random operations to every policy
// with random keys in use, checking the contract after each: Len matches a
// set of tracked keys, in-use keys are never evicted, Evict fails only when
// every tracked key is in use.
func TestRandomOperationsKeepContract(t *testing.T) {
	for _, np := range allPolicies {
		t.Run(np.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			p := mustMake(t, np, 32)
			tracked := map[uint64]bool{}
			inUse := map[uint64]bool{}
			evictable := func(k uint64) bool { return !inUse[k] }
			for step := range 20000 {
				k := rng.Uint64N(64)
				switch op := rng.IntN(10); {
				case op < 4:
					p.Insert(k, Meta{Bytes: int64(1 + rng.IntN(4)), RecomputeSeconds: rng.Float64()})
					tracked[k] = true
				case op < 6:
					p.Touch(k)
				case op < 7:
					p.Remove(k)
					delete(tracked, k)
				case op < 8:
					inUse[k] = !inUse[k]
				default:
					v, ok := p.Evict(evictable)
					if ok {
						if !tracked[v] || inUse[v] {
							t.Fatalf("step %d: evicted %d: tracked %v, in use %v", step, v, tracked[v], inUse[v])
						}
						delete(tracked, v)
					} else {
						for k := range tracked {
							if !inUse[k] {
								t.Fatalf("step %d: Evict found nothing but %d is evictable", step, k)
							}
						}
					}
				}
				if p.Len() != len(tracked) {
					t.Fatalf("step %d: Len %d, tracked %d", step, p.Len(), len(tracked))
				}
				if p.Contains(k) != tracked[k] {
					t.Fatalf("step %d: Contains(%d) = %v, want %v", step, k, p.Contains(k), tracked[k])
				}
			}
		})
	}
}

// TestNoAllocations checks that Insert, Touch and Evict allocate nothing
// once the policy's slab and index have grown to their working size (the
// keys stay below 4*capacity, so that a dense index stops growing too). Each run
// does a batch of operations so that even a rare allocation shows
// (AllocsPerRun rounds its average down).
func TestNoAllocations(t *testing.T) {
	if invariants.Enabled {
		t.Skip("the invariant checks (-tags invariants) allocate to format their messages")
	}
	const (
		capacity = 4096
		batch    = 256
	)
	for _, np := range allPolicies {
		t.Run(np.name, func(t *testing.T) {
			p := mustMake(t, np, capacity)
			rng := rand.New(rand.NewPCG(3, 4))
			// One key in 97 is in use, a different set at each eviction.
			var phase uint64
			evictable := func(k uint64) bool { return k%97 != phase }
			churn := func() {
				for range batch {
					k := rng.Uint64N(4 * capacity)
					if p.Contains(k) {
						p.Touch(k)
						continue
					}
					if p.Len() >= capacity {
						phase = k % 97
						p.Evict(evictable)
					}
					p.Insert(k, Meta{Bytes: 1, RecomputeSeconds: 1})
				}
			}
			for range 200 {
				churn()
			}
			if a := testing.AllocsPerRun(200, churn); a != 0 {
				t.Errorf("%v allocations per %d operations", a, batch)
			}
			touch := func() {
				for range batch {
					p.Touch(rng.Uint64N(4 * capacity))
				}
			}
			if a := testing.AllocsPerRun(200, touch); a != 0 {
				t.Errorf("%v allocations per %d Touch calls", a, batch)
			}
			insertEvict := func() {
				for range batch {
					phase = rng.Uint64N(97)
					p.Evict(evictable)
					for {
						if k := rng.Uint64N(4 * capacity); !p.Contains(k) {
							p.Insert(k, Meta{Bytes: 1, RecomputeSeconds: 1})
							break
						}
					}
				}
			}
			if a := testing.AllocsPerRun(200, insertEvict); a != 0 {
				t.Errorf("%v allocations per %d Evict+Insert pairs of new keys", a, batch)
			}
		})
	}
	a, err := NewSeenTwice[uint64](1<<12, 1<<12, func(k uint64) uint64 { return k })
	if err != nil {
		t.Fatal(err)
	}
	var k uint64
	record := func() {
		for range batch {
			k++
			a.Record(k % 5000)
			a.Admit(k)
		}
	}
	if n := testing.AllocsPerRun(100, record); n != 0 {
		t.Errorf("SeenTwice: %v allocations per %d Record+Admit", n, batch)
	}
}

// TestEvictDoesNotRewalkPinnedKeys: with half the keys in use (the oldest,
// as requests in flight hold them), evictions cost a few calls of evictable
// each, not a walk of every pinned key per eviction: the quadratic that made
// 10k requests in flight take minutes in a replay.
func TestEvictDoesNotRewalkPinnedKeys(t *testing.T) {
	const keys, pinned, evictions = 20000, 10000, 10000
	for _, np := range allPolicies {
		t.Run(np.name, func(t *testing.T) {
			p := mustMake(t, np, keys)
			for k := range uint64(keys) {
				p.Insert(k, Meta{Bytes: 1, RecomputeSeconds: 1})
			}
			calls := 0
			evictable := func(k uint64) bool { calls++; return k >= pinned }
			next := uint64(keys)
			for range evictions {
				v, ok := p.Evict(evictable)
				if !ok || v < pinned {
					t.Fatalf("evicted %d, %v", v, ok)
				}
				p.Insert(next, Meta{Bytes: 1, RecomputeSeconds: 1})
				next++
			}
			t.Logf("%d evictions with %d keys in use: %d calls of evictable", evictions, pinned, calls)
			if calls > 3*(evictions+pinned) {
				t.Errorf("%d calls of evictable for %d evictions past %d keys in use: more than 3 a key", calls, evictions, pinned)
			}
		})
	}
}

func TestNewDenseNamed(t *testing.T) {
	for _, name := range Names {
		p, err := NewDenseNamed[uint32](name, 8)
		if err != nil || p == nil {
			t.Fatalf("NewDenseNamed(%q): %v", name, err)
		}
		p.Insert(3, Meta{})
		if p.Len() != 1 {
			t.Errorf("%s: Len %d after one insert", name, p.Len())
		}
	}
	_, err := NewDenseNamed[uint32]("mru", 8)
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), `"mru"`) || !strings.Contains(err.Error(), "cost-aware") {
		t.Fatalf("unknown name: %v, want ErrInvalidArgument naming it and the known ones", err)
	}
}
