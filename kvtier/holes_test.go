package kvtier

import (
	"errors"
	"fmt"
	"testing"
)

// TestLookupHoles: with MaxHoleBlocks a lookup skips that many missing
// blocks and returns the cached ones after them, with their positions;
// Plan recomputes the holes; without it the lookup stops at the first.
func TestLookupHoles(t *testing.T) {
	keys := []Key{11, 12, 13, 14, 15, 16, 17}
	for _, tc := range []struct {
		maxHoles  int
		missing   []int
		positions string
		holes     uint64
	}{
		{0, []int{2}, "[0 1]", 0},
		{1, []int{2}, "[0 1 3 4 5 6]", 1},
		{1, []int{2, 4}, "[0 1 3]", 1},
		{2, []int{2, 4}, "[0 1 3 5 6]", 2},
		{2, []int{5, 6}, "[0 1 2 3 4]", 0}, // misses at the end are no holes
		{3, []int{0}, "[1 2 3 4 5 6]", 1},
	} {
		name := fmt.Sprintf("max%d-missing%v", tc.maxHoles, tc.missing)
		t.Run(name, func(t *testing.T) {
			fm := newFakeMover()
			fm.inline = true
			cfg := Config{BlockTokens: 4, Mover: fm, MaxHoleBlocks: tc.maxHoles}
			cfg.Tiers[GPU], cfg.Tiers[Host] = tierCfg(t, 16), tierCfg(t, 16)
			m := mustNew(t, cfg)
			var w Lease
			if err := m.InsertKeys(1, keys, GPU, &w); err != nil {
				t.Fatal(err)
			}
			if err := m.Commit(&w, nil); err != nil {
				t.Fatal(err)
			}
			m.lock()
			for _, i := range tc.missing {
				m.invalidate(w.Blocks[i].Ref) // w holds it: freed at Release
			}
			m.unlockAndSubmit(nil)
			m.Release(&w)

			var l Lease
			if err := m.LookupKeys(1, keys, &l); err != nil {
				t.Fatal(err)
			}
			var pos []int
			for _, b := range l.Blocks {
				pos = append(pos, b.Position)
				if b.Key != keys[b.Position] {
					t.Errorf("block at position %d has key %d, want %d", b.Position, b.Key, keys[b.Position])
				}
			}
			if got := fmt.Sprint(pos); got != tc.positions {
				t.Errorf("positions %s, want %s", got, tc.positions)
			}
			if got := m.Metrics().HoleBlocks; got != tc.holes {
				t.Errorf("Metrics.HoleBlocks = %d, want %d", got, tc.holes)
			}
			if err := m.Plan(&l); err != nil {
				t.Fatal(err)
			}
			for i, a := range l.actions {
				cached := false
				for _, b := range l.Blocks {
					cached = cached || b.Position == i
				}
				if want := map[bool]Action{true: Use, false: Recompute}[cached]; a != want {
					t.Errorf("block %d: planned %v, want %v", i, a, want)
				}
			}
			m.Release(&l)
			m.check(t)
		})
	}
	if _, err := New(Config{BlockTokens: 4, MaxHoleBlocks: -1, Tiers: [NumTiers]TierConfig{GPU: tierCfg(t, 4)}}); !errors.Is(err, ErrConfig) {
		t.Errorf("MaxHoleBlocks -1: %v, want ErrConfig", err)
	}
}
