package kvtier

import (
	"math/rand/v2"
	"testing"
)

// TestTableAgainstMap runs random inserts and removes of clustered keys
// (small integers, as trace ids are, and keys that share a home slot)
// through growth and backward-shift deletion, against a Go map.
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
			tb.remove(k)
			delete(ref, k)
		} else {
			tb.insert(k, uint32(i))
			ref[k] = uint32(i)
		}
		if i%997 == 0 {
			for k, v := range ref {
				if got, ok := tb.find(k); !ok || got != v {
					t.Fatalf("step %d: find(%#x) = %d, %v; want %d", i, k, got, ok, v)
				}
			}
		}
		if tb.len() != len(ref) {
			t.Fatalf("step %d: len %d, want %d", i, tb.len(), len(ref))
		}
	}
	for k := range Key(5000) {
		_, want := ref[k]
		if _, ok := tb.find(k); ok != want {
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
