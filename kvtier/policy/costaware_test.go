package policy

import (
	"math"
	"testing"
)

// TestCostAwareBadMeta: a size or cost that is not usable counts as 1, so
// the heap never holds a NaN or infinite priority.
func TestCostAwareBadMeta(t *testing.T) {
	p, err := NewCostAware[int](4, 100)
	if err != nil {
		t.Fatal(err)
	}
	p.Insert(1, Meta{Bytes: 10, RecomputeSeconds: 5})              // 0.5 per byte
	p.Insert(2, Meta{Bytes: -3, RecomputeSeconds: math.NaN()})     // 1
	p.Insert(3, Meta{Bytes: 0, RecomputeSeconds: math.Inf(1)})     // 1
	p.Insert(4, Meta{Bytes: 4, RecomputeSeconds: -2})              // 0.25
	p.Insert(5, Meta{Bytes: math.MaxInt64, RecomputeSeconds: 1e9}) // about 1e-10
	for _, want := range []int{5, 4, 1} {
		if got, ok := p.Evict(nil); !ok || got != want {
			t.Fatalf("Evict = %d, %v; want %d", got, ok, want)
		}
	}
	if l := p.Inflation(); l != 0.5 {
		t.Fatalf("L = %v after evicting a key of priority 0.5", l)
	}
	for p.Len() > 0 {
		p.Evict(nil)
	}
	if l := p.Inflation(); l != 1 {
		t.Fatalf("L = %v, want 1", l)
	}
}

// TestCostAwareFrequencyDecays: a key used often long ago loses to a key
// used a little recently, once enough decay periods have passed.
func TestCostAwareFrequencyDecays(t *testing.T) {
	p, err := NewCostAware[string](4, 10)
	if err != nil {
		t.Fatal(err)
	}
	p.Insert("old", Meta{Bytes: 1, RecomputeSeconds: 1})
	for range 8 {
		p.Touch("old") // freq 9 within the first period
	}
	p.Insert("new", Meta{Bytes: 1, RecomputeSeconds: 1})
	p.Touch("new")
	p.Touch("new") // freq 3
	// Without decay "old" (9) would stay; 40 calls later its count of 9
	// has halved 4 times to 0 and its next use makes it 1.
	p.Insert("filler", Meta{Bytes: 1, RecomputeSeconds: 100})
	for range 40 {
		p.Touch("filler")
	}
	p.Touch("old")
	p.Touch("new")
	if got, _ := p.Evict(nil); got != "old" {
		t.Fatalf("evicted %q; the old key's frequency did not decay", got)
	}
}
