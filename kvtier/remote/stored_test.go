package remote

import (
	"slices"
	"sync"
	"testing"
)

// TestOnStoredAfterWriteOrFind: OnStored hears of a block once its write
// succeeded, or once a writer found it in the store; not of one whose
// write failed.
func TestOnStoredAfterWriteOrFind(t *testing.T) {
	st := newMemStore()
	var mu sync.Mutex
	var heard []BlockMeta
	on := func(m BlockMeta) {
		mu.Lock()
		heard = append(heard, m)
		mu.Unlock()
	}
	a := newCache(t, Config{Store: st, BlockBytes: 64, OnStored: on, BreakerFailures: 100})
	b := newCache(t, Config{Store: st, BlockBytes: 64, OnStored: on, BreakerFailures: 100})
	m, p := block(1, 64, 5)
	a.Put(m, p)
	flush(t, a)
	b.Put(m, p) // found there
	flush(t, b)
	st.setDown(true)
	m2, p2 := block(2, 64, 5)
	a.Put(m2, p2) // fails
	flush(t, a)
	mu.Lock()
	defer mu.Unlock()
	if len(heard) != 2 || heard[0].Key != m.Key || heard[1].Key != m.Key || !slices.Equal(heard[1].Tokens, m.Tokens) ||
		heard[0].Parent != m.Parent || heard[0].Position != m.Position || heard[0].Salt != m.Salt {
		t.Fatalf("heard %+v; want block %#x twice", heard, m.Key)
	}
	if sa, sb := a.Stats(), b.Stats(); sa.Written != 1 || sb.Deduplicated != 1 || sa.WriteErrors != 1 {
		t.Fatalf("a %+v\nb %+v", sa, sb)
	}
}
