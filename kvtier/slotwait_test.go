package kvtier

import (
	"context"
	"errors"
	"runtime"
	"testing"
)

// TestWaitCopiesFrom: a GPU tier full of blocks whose write-through copies
// to the host are in flight has no evictable slot; an Insert short of slots
// waits for those copies, and after them finds its slots. The wait wakes
// when n copies out of the GPU ended, not before, and at once when none
// is in flight.
func TestWaitCopiesFrom(t *testing.T) {
	f := newFakeMover()
	cfg := Config{BlockTokens: 2, Mover: f, WriteThrough: true}
	cfg.Tiers[GPU] = tierCfg(t, 4)
	cfg.Tiers[Host] = tierCfg(t, 8)
	m := mustNew(t, cfg)
	ctx := context.Background()
	if waited, err := m.WaitCopiesFrom(ctx, GPU, 1); waited || err != nil {
		t.Fatalf("no copy in flight: WaitCopiesFrom = %v, %v; want false, nil", waited, err)
	}
	if n := insertReady(t, m, 0, toks(4, 2, 0), GPU); n != 4 {
		t.Fatalf("first prompt: %d of 4 blocks inserted", n)
	}
	if f.len() != 4 {
		t.Fatalf("%d copies pending, want the 4 write-through copies", f.len())
	}
	var l Lease
	if err := m.Insert(0, toks(2, 2, 100), GPU, &l); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Insert into a GPU tier whose blocks copies read: %v, want ErrNoSpace", err)
	}
	m.Release(&l)
	done := make(chan error, 1)
	go func() {
		waited, err := m.WaitCopiesFrom(ctx, GPU, 2)
		if !waited && err == nil {
			err = errors.New("did not wait with 4 copies in flight")
		}
		done <- err
	}()
	// Complete one copy: the waiter, counting 2, must not wake.
	m.awaitWaiter()
	complete := func() {
		f.mu.Lock()
		p := f.pending[0]
		f.pending = f.pending[1:]
		f.copy(p)
		f.mu.Unlock()
		p.t.Complete(p.i, nil)
	}
	complete()
	select {
	case err := <-done:
		t.Fatalf("woke after 1 of the 2 copies it waits for: %v", err)
	default:
	}
	complete()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := insertReady(t, m, 0, toks(2, 2, 100), GPU); n != 2 {
		t.Fatalf("after the wait: %d of 2 blocks inserted", n)
	}
	m.check(t)
	f.drain()
	m.check(t)
}

// TestWaitCopiesFromEnds: a waiter wakes when the last copy out of its tier
// ends though fewer than n did, and returns ctx's error when ctx ends
// first, leaving no waiter behind; bad input is refused.
func TestWaitCopiesFromEnds(t *testing.T) {
	f := newFakeMover()
	cfg := Config{BlockTokens: 2, Mover: f, WriteThrough: true}
	cfg.Tiers[GPU] = tierCfg(t, 4)
	cfg.Tiers[Host] = tierCfg(t, 8)
	m := mustNew(t, cfg)
	if _, err := m.WaitCopiesFrom(context.Background(), GPU, -1); !errors.Is(err, ErrBadInput) {
		t.Fatalf("n = -1: %v, want ErrBadInput", err)
	}
	if _, err := m.WaitCopiesFrom(context.Background(), NVMe, 1); !errors.Is(err, ErrBadInput) {
		t.Fatalf("absent tier: %v, want ErrBadInput", err)
	}
	insertReady(t, m, 0, toks(2, 2, 0), GPU)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if waited, err := m.WaitCopiesFrom(ctx, GPU, 1); !waited || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v, %v; want true, context.Canceled", waited, err)
	}
	if len(m.copyWaiters) != 0 {
		t.Fatalf("%d waiters left after a cancelled wait", len(m.copyWaiters))
	}
	done := make(chan error, 1)
	go func() {
		_, err := m.WaitCopiesFrom(context.Background(), GPU, 100)
		done <- err
	}()
	m.awaitWaiter()
	f.drain() // both copies end: none left in flight
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	m.check(t)
}

// TestRetryRefusedLoads: a prefix in the host tier whose loads Onboard
// refused, every GPU slot being read by write-through copies, loads after
// the wait for those copies: Refused counts the refusals, RetryRefused
// sets them back to Load, and the next Onboard starts every load.
func TestRetryRefusedLoads(t *testing.T) {
	f := newFakeMover()
	cfg := Config{BlockTokens: 2, Mover: f, WriteThrough: true}
	cfg.Tiers[GPU] = tierCfg(t, 4)
	cfg.Tiers[Host] = tierCfg(t, 8)
	m := mustNew(t, cfg)
	x := toks(3, 2, 500)
	if n := insertReady(t, m, 0, x, Host); n != 3 {
		t.Fatalf("x into the host tier: %d of 3 blocks", n)
	}
	if n := insertReady(t, m, 0, toks(4, 2, 0), GPU); n != 4 {
		t.Fatalf("filling the GPU: %d of 4 blocks", n)
	}
	var l Lease
	if err := m.Lookup(0, x, &l); err != nil {
		t.Fatal(err)
	}
	defer m.Release(&l)
	if err := m.Plan(&l); err != nil {
		t.Fatal(err)
	}
	if err := m.Onboard(&l); err != nil {
		t.Fatal(err)
	}
	if got := l.Refused(); got != 3 {
		t.Fatalf("Refused = %d with every GPU slot read by a copy, want 3", got)
	}
	if m.CopiesReading(GPU) != 4 {
		t.Fatalf("CopiesReading(GPU) = %d, want the 4 write-through copies", m.CopiesReading(GPU))
	}
	f.drain()
	if got := l.RetryRefused(); got != 3 {
		t.Fatalf("RetryRefused = %d, want 3", got)
	}
	if l.Refused() != 0 {
		t.Fatalf("Refused = %d after RetryRefused", l.Refused())
	}
	if err := m.Onboard(&l); err != nil {
		t.Fatal(err)
	}
	for i, b := range l.Blocks {
		if !b.Loading {
			t.Fatalf("block %d: %v (%v) after the retry, want loading", i, b.Action, b.Why)
		}
	}
	f.drain()
	if err := m.Wait(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	m.check(t)
}

// awaitWaiter returns once a WaitCopiesFrom call is registered (no sleep).
func (m *Manager) awaitWaiter() {
	m.lock()
	for len(m.copyWaiters) == 0 {
		m.unlock()
		runtime.Gosched()
		m.lock()
	}
	m.unlock()
}

// refuseAll admits nothing: the write-through copies into its tier stop.
type refuseAll struct{}

func (refuseAll) Record(Key)     {}
func (refuseAll) Admit(Key) bool { return false }

// TestFlushWaitsForCopiesInFlight: a block whose write-through copy to the
// host is still in flight when Flush starts reaches the bottom tier too
// (the NVMe tier admits no write-through copy here, so only Flush puts it
// there). Before, Flush skipped it as "on its way down", waited for that
// copy, and returned with the block dirty in the host tier.
func TestFlushWaitsForCopiesInFlight(t *testing.T) {
	f := newFakeMover()
	cfg := Config{BlockTokens: 2, Mover: f, WriteThrough: true}
	cfg.Tiers[GPU] = tierCfg(t, 4)
	cfg.Tiers[Host] = tierCfg(t, 8)
	cfg.Tiers[NVMe] = tierCfg(t, 8)
	cfg.Tiers[NVMe].Admitter = refuseAll{}
	m := mustNew(t, cfg)
	if n := insertReady(t, m, 0, toks(2, 2, 0), GPU); n != 2 {
		t.Fatalf("%d of 2 blocks inserted", n)
	}
	if f.len() != 2 {
		t.Fatalf("%d copies pending, want the 2 write-through copies to the host", f.len())
	}
	done := make(chan error, 1)
	go func() { done <- m.Flush(context.Background()) }()
	// Complete the copies only once Flush waits for them (Drain).
	m.lock()
	for m.drained == nil {
		m.unlock()
		runtime.Gosched()
		m.lock()
	}
	m.unlock()
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Metrics().Tiers[NVMe].ResidentBlocks; got != 2 {
				t.Fatalf("after Flush %d blocks in the NVMe tier, want 2", got)
			}
			m.check(t)
			return
		default:
			f.drain()
			runtime.Gosched()
		}
	}
}
