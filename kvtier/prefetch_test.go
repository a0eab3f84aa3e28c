package kvtier

import (
	"context"
	"errors"
	"testing"
)

// TestPrefetch: blocks held only in NVMe are copied into the host tier in
// the background, at most maxBlocks of them, with no admission record;
// a later lookup finds them in the host tier.
func TestPrefetch(t *testing.T) {
	f := newFakeMover()
	f.inline = true
	adm := &countAdmitter{seen: map[Key]int{}}
	cfg := Config{BlockTokens: 2, Mover: f}
	cfg.Tiers[GPU], cfg.Tiers[Host], cfg.Tiers[NVMe] = tierCfg(t, 8), tierCfg(t, 8), tierCfg(t, 8)
	cfg.Tiers[NVMe].Admitter = adm
	m := mustNew(t, cfg)
	a := toks(4, 2, 0)
	insertReady(t, m, 0, a, NVMe)
	for _, c := range []struct {
		max, want int
	}{{1, 1}, {0, 3}, {0, 0}} {
		n, err := m.Prefetch(0, a, Host, c.max)
		if err != nil || n != c.want {
			t.Errorf("Prefetch(max %d) = %d, %v; want %d", c.max, n, err, c.want)
		}
		if err := m.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	var l Lease
	if err := m.Lookup(0, a, &l); err != nil || l.Len() != 4 {
		t.Fatalf("lookup: %d blocks, %v", l.Len(), err)
	}
	for i, b := range l.Blocks {
		if b.Tier != Host {
			t.Errorf("block %d is found in %v after the prefetch, want host", i, b.Tier)
		}
	}
	m.Release(&l)
	for k, n := range adm.seen {
		if n != 1 {
			t.Errorf("block %#x recorded %d times, want once (by the lookup, not the prefetches)", uint64(k), n)
		}
	}
	if _, err := m.Prefetch(0, a, GPU, 0); !errors.Is(err, ErrBadInput) {
		t.Errorf("Prefetch into the GPU: %v", err)
	}
	if _, err := m.PrefetchKeys(0, nil, Host, -1); !errors.Is(err, ErrBadInput) {
		t.Errorf("PrefetchKeys with a negative bound: %v", err)
	}
	if err := m.Verify(); err != nil {
		t.Fatal(err)
	}
}
