package kvtier

import (
	"math/rand/v2"
	"testing"
)

// TestTableAgainstMap runs random inserts and removes of clustered keys
// (small integers, as trace ids are, and keys that share a home slot)
// through growth and backward-shift deletion, against a Go map; each entry
// keeps its token hash (a function of its index here) through both.
func TestTableAgainstMap(t *testing.T) {
	var tb table
	ref := map[Key]uint32{}
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range 200_000 {
		k := Key(rng.IntN(5000))
		if rng.IntN(3) == 0 {
			k <<= 40 // many keys with equal low bits
		}
		if _, ok := ref[k]; ok {
			tb.remove(0, k)
			delete(ref, k)
		} else {
			tb.insert(0, k, uint32(i), ^uint32(i))
			ref[k] = uint32(i)
		}
		if i%997 == 0 {
			for k, v := range ref {
				if got, ok := tb.find(0, k); !ok || got != v {
					t.Fatalf("step %d: find(%#x) = %d, %v; want %d", i, k, got, ok, v)
				}
				if e := tb.entry(indexKey(0, k)); e.tokens != ^v {
					t.Fatalf("step %d: key %#x's token hash %#x, want %#x", i, k, e.tokens, ^v)
				}
			}
		}
		if tb.len() != len(ref) {
			t.Fatalf("step %d: len %d, want %d", i, tb.len(), len(ref))
		}
	}
	for k := range Key(5000) {
		_, want := ref[k]
		if _, ok := tb.find(0, k); ok != want {
			t.Fatalf("find(%d) = %v, want %v", k, ok, want)
		}
	}
}

func TestKeysOnlyBlocksNeverHitByTokens(t *testing.T) {
	m := oneTier(t, Host, 8, 2)
	h, _ := NewHasher(2)
	a := toks(2, 2, 0)
	keys := h.AppendKeys(nil, 0, 0, a)
	var l Lease
	if err := m.InsertKeys(0, keys, Host, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(&l, nil); err != nil {
		t.Fatal(err)
	}
	m.Release(&l)
	if n := lookupLen(t, m, 0, a); n != 0 {
		t.Fatalf("blocks stored without tokens hit %d blocks of a token lookup", n)
	}
	// Inserting the tokens later stores them; then token lookups hit.
	if n := insertReady(t, m, 0, a, Host); n != 2 {
		t.Fatalf("insert with tokens: %d", n)
	}
	if n := lookupLen(t, m, 0, a); n != 2 {
		t.Fatalf("after storing tokens: %d hits", n)
	}
	m.check(t)
}

// TestEqualKeysUnderTwoSalts: two tenants whose trace ids both start at 1
// keep their blocks side by side; each hits only its own (invariant 1).
func TestEqualKeysUnderTwoSalts(t *testing.T) {
	m := oneTier(t, Host, 8, 2)
	keys := []Key{1, 2, 3}
	for _, salt := range []Salt{7, 8} {
		var l Lease
		if err := m.InsertKeys(salt, keys, Host, &l); err != nil {
			t.Fatal(err)
		}
		if err := m.Commit(&l, nil); err != nil {
			t.Fatal(err)
		}
		m.Release(&l)
	}
	for _, salt := range []Salt{7, 8, 9} {
		var l Lease
		if err := m.LookupKeys(salt, keys, &l); err != nil {
			t.Fatal(err)
		}
		want := 3
		if salt == 9 {
			want = 0
		}
		if l.Len() != want {
			t.Errorf("salt %d: %d hits, want %d", salt, l.Len(), want)
		}
		m.Release(&l)
	}
	if got := m.Metrics().Tiers[Host].ResidentBlocks; got != 6 {
		t.Errorf("%d blocks resident, want both tenants' 6", got)
	}
	m.check(t)
}

// TestIndexKeyMixesSalt: salt 0 leaves a key as it is; other salts move
// small keys far apart, and the table finds each pair under its own salt.
func TestIndexKeyMixesSalt(t *testing.T) {
	if indexKey(0, 42) != 42 {
		t.Fatal("salt 0 changed the key")
	}
	var tb table
	for s := range Salt(64) {
		for k := range Key(64) {
			tb.insert(s, k, uint32(s)<<8|uint32(k), 0)
		}
	}
	for s := range Salt(64) {
		for k := range Key(64) {
			if got, ok := tb.find(s, k); !ok || got != uint32(s)<<8|uint32(k) {
				t.Fatalf("find(%d, %d) = %d, %v", s, k, got, ok)
			}
		}
	}
	tb.remove(3, 5)
	if _, ok := tb.find(3, 5); ok || tb.len() != 64*64-1 {
		t.Fatalf("after remove: len %d", tb.len())
	}
	if _, ok := tb.find(4, 5); !ok {
		t.Fatal("removing (3, 5) removed (4, 5)")
	}
}
