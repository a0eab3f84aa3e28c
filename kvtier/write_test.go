package kvtier

import (
	"context"
	"testing"
)

// stubGate refuses every write with why, and counts what it was asked.
type stubGate struct {
	why       Refusal
	positions []int
}

func (g *stubGate) AllowWrite(position int, bytes int64) Refusal {
	g.positions = append(g.positions, position)
	return g.why
}

// TestGateDecidesTheManagersWrites: write-through into a gated tier asks
// the gate for each block, by position, after the Admitter; a refusal
// leaves the block unwritten and is counted by its reason.
func TestGateDecidesTheManagersWrites(t *testing.T) {
	for _, why := range []Refusal{NotWorth, OverRate, OverEndurance, QueueFull, Allowed} {
		f := newFakeMover()
		f.inline = true
		g := &stubGate{why: why}
		cfg := Config{BlockTokens: 2, Mover: f, WriteThrough: true}
		cfg.Tiers[GPU], cfg.Tiers[Host] = tierCfg(t, 8), tierCfg(t, 8)
		cfg.Tiers[Host].Gate = g
		m := mustNew(t, cfg)
		insertReady(t, m, 0, toks(3, 2, 0), GPU)
		if err := m.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		mt := m.Metrics()
		want := int64(0)
		if why == Allowed {
			want = 3
		} else if got := mt.Tiers[Host].Refused[why]; got != 3 {
			t.Errorf("%v: %d refusals counted, want 3", why, got)
		}
		if got := mt.Tiers[Host].ResidentBlocks; got != want {
			t.Errorf("%v: %d blocks written to the host, want %d", why, got, want)
		}
		if len(g.positions) != 3 || g.positions[2] != 2 {
			t.Errorf("%v: the gate was asked about positions %v, want 0 1 2", why, g.positions)
		}
		if err := m.Verify(); err != nil {
			t.Fatal(err)
		}
	}
	for r := range NumRefusals + 1 {
		if r.String() == "" || (r == NumRefusals) != (r.String() == "refusal(?)") {
			t.Errorf("Refusal(%d).String() = %q", r, r.String())
		}
	}
}

// TestWantedAfterInvalidate: a copy queued by the mover is wanted until
// its block is invalidated; the mover then fails it instead of making it,
// and the destination is freed.
func TestWantedAfterInvalidate(t *testing.T) {
	m, f := twoTier(t, 4, 8, true)
	a := toks(2, 2, 0)
	var w Lease
	if err := m.Insert(0, a, GPU, &w); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(&w, nil); err != nil { // two write-through copies, held by f
		t.Fatal(err)
	}
	m.Release(&w)
	f.mu.Lock()
	if len(f.pending) != 2 {
		t.Fatalf("%d copies pending, want 2", len(f.pending))
	}
	p := f.pending[0]
	f.mu.Unlock()
	if !p.t.Wanted(p.i) {
		t.Fatal("a pending copy of a live block is not wanted")
	}
	if n, err := m.Invalidate(0, a); err != nil || n != 2 {
		t.Fatalf("Invalidate: %d, %v", n, err)
	}
	if p.t.Wanted(p.i) {
		t.Fatal("a pending copy of an invalidated block is still wanted")
	}
	f.drain()
	if got := m.Metrics().Tiers[Host].ResidentBlocks; got != 0 {
		t.Errorf("%d host blocks after the invalidated blocks' copies ended", got)
	}
	if err := m.Verify(); err != nil {
		t.Fatal(err)
	}
}
