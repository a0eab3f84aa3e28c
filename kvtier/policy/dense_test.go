package policy

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// ref is a Dense key type like kvtier.BlockRef, so that the tests go through
// the ~uint32 constraint rather than plain uint32.
type ref uint32

// densePolicies builds each policy with a dense index, behind the tests'
// uint64 tracker, so that every contract, model, trace and allocation test
// runs over both kinds of index.
var densePolicies = []namedPolicy{
	{"DenseLRU", func(c int) (tracker, error) { return newDenseTracker(NewDenseLRU[ref](c)) }},
	{"DenseTwoQ", func(c int) (tracker, error) { return newDenseTracker(NewDenseTwoQ[ref](c)) }},
	{"DenseS3FIFO", func(c int) (tracker, error) { return newDenseTracker(NewDenseS3FIFO[ref](c)) }},
	{"DenseCostAware", func(c int) (tracker, error) { return newDenseTracker(NewDenseCostAware[ref](c, 4*c)) }},
}

// denseTracker adapts a policy over ref keys to the tests' uint64 keys. Its
// evictable wrapper is bound once, so Evict allocates nothing here either.
type denseTracker struct {
	p interface {
		Policy[ref]
		Contains(ref) bool
	}
	f         func(uint64) bool // Evict's current filter
	evictable func(ref) bool    // calls f
}

func newDenseTracker[P interface {
	Policy[ref]
	Contains(ref) bool
}](p P, err error) (tracker, error) {
	if err != nil {
		return nil, err
	}
	t := &denseTracker{p: p}
	t.evictable = func(k ref) bool { return t.f(uint64(k)) }
	return t, nil
}

func denseKey(k uint64) ref {
	if k > math.MaxUint32 {
		panic(fmt.Sprintf("test key %d does not fit a dense policy", k))
	}
	return ref(k)
}

func (t *denseTracker) Insert(k uint64, m Meta) { t.p.Insert(denseKey(k), m) }
func (t *denseTracker) Touch(k uint64)          { t.p.Touch(denseKey(k)) }
func (t *denseTracker) Remove(k uint64)         { t.p.Remove(denseKey(k)) }
func (t *denseTracker) Len() int                { return t.p.Len() }
func (t *denseTracker) Contains(k uint64) bool  { return t.p.Contains(denseKey(k)) }
func (t *denseTracker) Evict(f func(uint64) bool) (uint64, bool) {
	if f == nil {
		v, ok := t.p.Evict(nil)
		return uint64(v), ok
	}
	t.f = f
	v, ok := t.p.Evict(t.evictable)
	t.f = nil
	return uint64(v), ok
}

func TestDenseConstructorsRejectBadArguments(t *testing.T) {
	for _, tc := range []struct {
		name, arg string
		err       error
	}{
		{"NewDenseLRU(0)", "capacity", second(NewDenseLRU[ref](0))},
		{"NewDenseLRU(huge)", "capacity", second(NewDenseLRU[ref](math.MaxInt32))},
		{"NewDenseTwoQ(-1)", "capacity", second(NewDenseTwoQ[ref](-1))},
		{"NewDenseS3FIFO(huge)", "capacity", second(NewDenseS3FIFO[ref](1 << 31))},
		{"NewDenseCostAware(0,1)", "capacity", second(NewDenseCostAware[ref](0, 1))},
		{"NewDenseCostAware(1,-3)", "decayCalls", second(NewDenseCostAware[ref](1, -3))},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		constructor, _, _ := strings.Cut(tc.name, "(")
		if !errors.Is(tc.err, ErrInvalidArgument) || !strings.Contains(tc.err.Error(), constructor+": "+tc.arg+" = ") {
			t.Errorf("%s: error %q does not name %s and %s or wrap ErrInvalidArgument", tc.name, tc.err, constructor, tc.arg)
		}
	}
}

// TestDenseIndexGrows inserts keys far beyond the capacity hint, in an order
// that makes the index grow several times, and keys never inserted stay
// absent on both sides of the slice's end.
func TestDenseIndexGrows(t *testing.T) {
	p, err := NewDenseLRU[ref](2)
	if err != nil {
		t.Fatal(err)
	}
	keys := []ref{0, 5000, 70, 1 << 20, 3}
	for _, k := range keys {
		p.Insert(k, Meta{})
	}
	for _, k := range keys {
		if !p.Contains(k) {
			t.Fatalf("key %d lost after the index grew", k)
		}
	}
	for _, k := range []ref{1, 4999, 1<<20 - 1, 1<<20 + 1, math.MaxUint32} {
		if p.Contains(k) {
			t.Fatalf("key %d never inserted but tracked", k)
		}
		p.Touch(k)  // absent beyond the end: no-op, no growth
		p.Remove(k) // likewise
	}
	for _, want := range keys {
		if got, ok := p.Evict(nil); !ok || got != want {
			t.Fatalf("Evict = %d, %v; want %d (insertion order)", got, ok, want)
		}
	}
	if p.Len() != 0 {
		t.Fatalf("Len %d after evicting everything", p.Len())
	}
}

// TestReusedKeyIsFresh checks that a key that was used, then removed, and
// inserted again (as the block manager reuses a freed BlockRef for a new
// block) carries nothing of its past: the policy then evicts exactly as one
// whose same history was played on another key that was removed.
func TestReusedKeyIsFresh(t *testing.T) {
	const reused, other = 7, 1000
	for _, np := range allPolicies {
		t.Run(np.name, func(t *testing.T) {
			play := func(old uint64) []uint64 {
				p := mustMake(t, np, 16)
				for k := range uint64(16) {
					if k != reused {
						p.Insert(k, Meta{Bytes: 1, RecomputeSeconds: float64(1 + k%3)})
					}
				}
				// old is used heavily: most recent, top counter, high priority.
				p.Insert(old, Meta{Bytes: 1, RecomputeSeconds: 100})
				for range 5 {
					p.Touch(old)
				}
				p.Evict(nil) // some policies move keys only on eviction
				p.Remove(old)
				p.Insert(reused, Meta{Bytes: 1})
				var order []uint64
				for {
					v, ok := p.Evict(nil)
					if !ok {
						return order
					}
					order = append(order, v)
				}
			}
			got, want := play(reused), play(other)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("eviction order with key %d reused: %v; with a fresh key: %v", reused, got, want)
			}
		})
	}
}
