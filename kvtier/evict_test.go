package kvtier

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// threeTiers is a manager of 4 GPU, 8 host and 16 NVMe slots over a fake
// mover, write-back.
func threeTiers(t *testing.T, fm *fakeMover) *Manager {
	t.Helper()
	cfg := Config{BlockTokens: 4, Mover: fm}
	cfg.Tiers[GPU], cfg.Tiers[Host], cfg.Tiers[NVMe] = tierCfg(t, 4), tierCfg(t, 8), tierCfg(t, 16)
	return mustNew(t, cfg)
}

// insertGPU inserts tokens into the GPU and commits them.
func insertGPU(t *testing.T, m *Manager, salt Salt, tokens []int32) {
	t.Helper()
	var w Lease
	if err := m.Insert(salt, tokens, GPU, &w); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(&w, nil); err != nil {
		t.Fatal(err)
	}
	m.Release(&w)
}

func tiersOf(t *testing.T, m *Manager, salt Salt, tokens []int32) []Tier {
	t.Helper()
	var l Lease
	if err := m.Lookup(salt, tokens, &l); err != nil {
		t.Fatal(err)
	}
	defer m.Release(&l)
	var ts []Tier
	for _, b := range l.Blocks {
		ts = append(ts, b.Tier)
	}
	return ts
}

// TestEvictToNVMe: Evict copies a GPU-only prefix down to NVMe, waits, and
// drops the faster copies; a leased block keeps its GPU copy.
func TestEvictToNVMe(t *testing.T) {
	fm := newFakeMover()
	fm.inline = true
	m := threeTiers(t, fm)
	p := toks(3, 4, 100)
	insertGPU(t, m, 1, p)
	var hold Lease
	if err := m.Lookup(1, p[:4], &hold); err != nil {
		t.Fatal(err)
	}
	n, err := m.Evict(context.Background(), 1, p, NVMe)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("Evict took %d blocks out of the GPU, want 2 (the third is leased)", n)
	}
	m.Release(&hold)
	if got := tiersOf(t, m, 1, p); len(got) != 3 || got[0] != GPU || got[1] != NVMe || got[2] != NVMe {
		t.Errorf("tiers after Evict: %v, want [gpu nvme nvme]", got)
	}
	if _, err := m.Evict(context.Background(), 1, p, NumTiers); !errors.Is(err, ErrBadInput) {
		t.Errorf("Evict to tier(3): %v, want ErrBadInput", err)
	}
	m.check(t)
}

// TestInvalidate: by tokens and by salt, idle blocks leave every tier at
// once; a leased one stays readable to its lease and is forgotten at its
// Release; other salts are untouched; an Insert brings it back.
func TestInvalidate(t *testing.T) {
	fm := newFakeMover()
	fm.inline = true
	m := threeTiers(t, fm)
	a, b := toks(2, 4, 0), toks(2, 4, 50)
	insertGPU(t, m, 1, a)
	insertGPU(t, m, 2, b)
	if _, err := m.Evict(context.Background(), 1, a, Host); err != nil {
		t.Fatal(err)
	}
	insertGPU(t, m, 1, a) // now in the GPU and the host
	var hold Lease
	if err := m.Lookup(1, a, &hold); err != nil {
		t.Fatal(err)
	}
	n, err := m.Invalidate(1, a)
	if err != nil || n != 2 {
		t.Fatalf("Invalidate: %d, %v; want 2", n, err)
	}
	if got := tiersOf(t, m, 1, a); len(got) != 0 {
		t.Errorf("lookup after Invalidate found %v", got)
	}
	if mt := m.Metrics(); mt.Tiers[GPU].ResidentBlocks != 4 || mt.Invalidations != 2 {
		t.Errorf("while leased: %d GPU blocks resident (want 4), %d invalidations (want 2)", mt.Tiers[GPU].ResidentBlocks, mt.Invalidations)
	}
	m.Release(&hold)
	if mt := m.Metrics(); mt.Tiers[GPU].ResidentBlocks != 2 || mt.Tiers[Host].ResidentBlocks != 0 {
		t.Errorf("after Release: %d GPU and %d host blocks resident, want 2 and 0", mt.Tiers[GPU].ResidentBlocks, mt.Tiers[Host].ResidentBlocks)
	}
	m.check(t)
	insertGPU(t, m, 1, a)
	if got := tiersOf(t, m, 1, a); len(got) != 2 {
		t.Errorf("re-inserted prefix: lookup found %v", got)
	}
	if n := m.InvalidateSalt(2); n != 2 {
		t.Errorf("InvalidateSalt(2) = %d, want 2", n)
	}
	if got := tiersOf(t, m, 2, b); len(got) != 0 {
		t.Errorf("salt 2 after InvalidateSalt: found %v", got)
	}
	if got := tiersOf(t, m, 1, a); len(got) != 2 {
		t.Errorf("salt 1 after InvalidateSalt(2): found %v", got)
	}
	m.check(t)
}

// TestInvalidateDuringCopy: a block invalidated while a copy reads it is
// freed when the copy completes, and not propagated on.
func TestInvalidateDuringCopy(t *testing.T) {
	fm := newFakeMover()
	cfg := Config{BlockTokens: 4, Mover: fm, WriteThrough: true}
	cfg.Tiers[GPU], cfg.Tiers[Host], cfg.Tiers[NVMe] = tierCfg(t, 4), tierCfg(t, 8), tierCfg(t, 16)
	m := mustNew(t, cfg)
	p := toks(2, 4, 0)
	insertGPU(t, m, 1, p) // write-through copies to the host pending
	if n, _ := m.Invalidate(1, p); n != 2 {
		t.Fatalf("Invalidate = %d, want 2", n)
	}
	fm.drain()
	mt := m.Metrics()
	for tier := range NumTiers {
		if mt.Tiers[tier].ResidentBlocks != 0 {
			t.Errorf("%v holds %d blocks after the copies of invalidated blocks completed", tier, mt.Tiers[tier].ResidentBlocks)
		}
	}
	m.check(t)
}

// TestDrainAndFlush: Drain returns once the background copies are done
// (and honours its context before); Flush writes every block down to NVMe.
func TestDrainAndFlush(t *testing.T) {
	fm := newFakeMover()
	m := threeTiers(t, fm)
	for i := range 6 { // 6 blocks through a 4-slot GPU: demotions pending
		var w Lease
		err := m.Insert(1, toks(1, 4, int32(100*i)), GPU, &w)
		if err == nil {
			err = m.Commit(&w, nil)
		}
		m.Release(&w)
		if err != nil && !errors.Is(err, ErrNoSpace) {
			t.Fatal(err)
		}
	}
	if fm.len() == 0 {
		t.Fatal("no demotion pending: the test checks nothing")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	if err := m.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Drain with copies pending and nobody completing them: %v", err)
	}
	cancel()
	done := make(chan error)
	go func() { done <- m.Drain(context.Background()) }()
	fm.drain()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	fm.inline = true
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	mt := m.Metrics()
	if got := mt.Tiers[NVMe].ResidentBlocks; got != mt.Records {
		t.Errorf("after Flush %d of %d blocks are in NVMe", got, mt.Records)
	}
	m.check(t)
}

// TestOnboardReasons: a load Onboard cannot start becomes a Recompute with
// its reason, counted in Metrics.
func TestOnboardReasons(t *testing.T) {
	fm := newFakeMover()
	fm.inline = true
	m := threeTiers(t, fm)
	p := toks(2, 4, 0)
	insertGPU(t, m, 1, p)
	if _, err := m.Evict(context.Background(), 1, p, Host); err != nil {
		t.Fatal(err)
	}
	var fill Lease // every GPU slot leased: nothing to evict
	if err := m.Insert(1, toks(4, 4, 500), GPU, &fill); err != nil {
		t.Fatal(err)
	}
	var l Lease
	if err := m.Lookup(1, p, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Plan(&l); err != nil {
		t.Fatal(err)
	}
	if err := m.Onboard(&l); err != nil {
		t.Fatal(err)
	}
	for _, b := range l.Blocks {
		if b.Action != Recompute || b.Why != NoGPUSlot {
			t.Errorf("block %#x: %v (%v), want recompute (no_gpu_slot)", uint64(b.Key), b.Action, b.Why)
		}
	}
	if got := m.Metrics().Recomputes[NoGPUSlot]; got != 2 {
		t.Errorf("Metrics.Recomputes[no_gpu_slot] = %d, want 2", got)
	}
	m.Release(&l)
	m.Release(&fill)
	m.check(t)
}

// TestEvictInvalidateConcurrent runs lookups against Evict, Invalidate,
// InvalidateSalt, Flush and Drain; the invariants hold throughout.
func TestEvictInvalidateConcurrent(t *testing.T) {
	fm := newFakeMover()
	fm.inline = true
	cfg := Config{BlockTokens: 4, Mover: fm}
	cfg.Tiers[GPU], cfg.Tiers[Host], cfg.Tiers[NVMe] = tierCfg(t, 32), tierCfg(t, 64), tierCfg(t, 256)
	m := mustNew(t, cfg)
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			var l Lease
			for range 300 {
				salt := Salt(1 + rng.IntN(2))
				p := toks(1+rng.IntN(4), 4, int32(16*rng.IntN(8)))
				switch rng.IntN(6) {
				case 0:
					if err := m.Insert(salt, p, GPU, &l); err == nil {
						_ = m.Commit(&l, nil)
					}
					m.Release(&l)
				case 1:
					if _, err := m.Evict(ctx, salt, p, Tier(1+rng.IntN(2))); err != nil && !errors.Is(err, ErrNoSpace) {
						t.Error(err)
					}
				case 2:
					_, _ = m.Invalidate(salt, p)
				case 3:
					if rng.IntN(10) == 0 {
						m.InvalidateSalt(salt)
					} else if err := m.Drain(ctx); err != nil {
						t.Error(err)
					}
				case 4:
					if rng.IntN(10) == 0 {
						if err := m.Flush(ctx); err != nil && !errors.Is(err, ErrNoSpace) {
							t.Error(err)
						}
					}
				default:
					if err := m.Lookup(salt, p, &l); err != nil {
						t.Error(err)
					}
					m.Release(&l)
				}
			}
		})
	}
	wg.Wait()
	m.check(t)
}

// TestPromote: NVMe hits promoted into the host tier are loaded from the
// host by a later Onboard, and stay in the host.
func TestPromote(t *testing.T) {
	fm := newFakeMover()
	fm.inline = true
	m := threeTiers(t, fm)
	ctx := context.Background()
	p := toks(2, 4, 0)
	insertGPU(t, m, 1, p)
	if _, err := m.Evict(ctx, 1, p, NVMe); err != nil {
		t.Fatal(err)
	}
	var l Lease
	if err := m.Lookup(1, p, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Promote(&l, GPU); !errors.Is(err, ErrBadInput) {
		t.Errorf("Promote into the GPU: %v, want ErrBadInput", err)
	}
	if err := m.Promote(&l, Host); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(ctx, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Plan(&l); err != nil {
		t.Fatal(err)
	}
	if err := m.Onboard(&l); err != nil {
		t.Fatal(err)
	}
	for _, b := range l.Blocks {
		if !b.Loading || b.Tier != Host {
			t.Errorf("block %#x: loading %v from %v, want a load from the host", uint64(b.Key), b.Loading, b.Tier)
		}
	}
	if err := m.Wait(ctx, &l); err != nil {
		t.Fatal(err)
	}
	m.Release(&l)
	if mt := m.Metrics(); mt.Tiers[Host].ResidentBlocks != 2 || mt.Tiers[NVMe].ResidentBlocks != 2 {
		t.Errorf("after the load: %d host and %d nvme blocks, want 2 and 2", mt.Tiers[Host].ResidentBlocks, mt.Tiers[NVMe].ResidentBlocks)
	}
	m.check(t)
}

// TestSetUsableSlots: a tier hands out only its usable slots (evicting
// within them) until they are raised; bad counts are refused.
func TestSetUsableSlots(t *testing.T) {
	fm := newFakeMover()
	fm.inline = true
	m := threeTiers(t, fm)
	if err := m.SetUsableSlots(Host, 2); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		var w Lease
		err := m.Insert(1, toks(1, 4, int32(100*i)), Host, &w)
		if errors.Is(err, ErrNoSpace) { // write-back: the victim's demotion has completed since
			m.Release(&w)
			err = m.Insert(1, toks(1, 4, int32(100*i)), Host, &w)
		}
		if err != nil {
			t.Fatal(err)
		}
		if s := w.Blocks[0].Slot; s >= 2 {
			t.Errorf("insert %d got host slot %d with 2 usable", i, s)
		}
		_ = m.Commit(&w, nil)
		m.Release(&w)
	}
	if got := m.Metrics().Tiers[Host].ResidentBlocks; got != 2 {
		t.Errorf("%d host blocks resident with 2 usable slots", got)
	}
	if err := m.SetUsableSlots(Host, 8); err != nil {
		t.Fatal(err)
	}
	var w Lease
	if err := m.Insert(1, toks(1, 4, 900), Host, &w); err != nil {
		t.Fatal(err)
	}
	if s := w.Blocks[0].Slot; s != 2 {
		t.Errorf("after raising: host slot %d, want the next new one, 2", s)
	}
	_ = m.Commit(&w, nil)
	m.Release(&w)
	for _, n := range []int{-1, 9} {
		if err := m.SetUsableSlots(Host, n); !errors.Is(err, ErrBadInput) {
			t.Errorf("SetUsableSlots(host, %d): %v, want ErrBadInput", n, err)
		}
	}
	if err := m.SetUsableSlots(NumTiers, 1); !errors.Is(err, ErrBadInput) {
		t.Errorf("SetUsableSlots(tier(3)): %v", err)
	}
	m.check(t)
}
