package kvtier

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestShardedMoverErrors: a sharded mover needs shards, and a shard whose
// Submit fails fails the op on every shard: the load reports the shard's
// error, the block stays where it was and is not resident on the GPU.
func TestShardedMoverErrors(t *testing.T) {
	if _, err := NewShardedMover(); !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "no shard") {
		t.Errorf("NewShardedMover() = %v, want ErrBadInput naming no shard", err)
	}
	if _, err := NewShardedMover(newFakeMover(), nil); !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "shard 1 is nil") {
		t.Errorf("NewShardedMover(mover, nil) = %v, want ErrBadInput naming shard 1", err)
	}

	ok, broken := newFakeMover(), newFakeMover()
	ok.inline = true
	sm, err := NewShardedMover(ok, broken)
	if err != nil {
		t.Fatal(err)
	}
	if sm.Shards() != 2 {
		t.Fatalf("Shards() = %d, want 2", sm.Shards())
	}
	cfg := Config{BlockTokens: 2, Mover: sm}
	cfg.Tiers[GPU] = tierCfg(t, 4)
	cfg.Tiers[Host] = tierCfg(t, 4)
	m := mustNew(t, cfg)
	a := toks(2, 2, 0)
	broken.inline = true
	insertReady(t, m, 0, a, Host)
	broken.inline = false
	broken.submitErr = errors.New("queue closed")
	var l Lease
	if err := m.Lookup(0, a, &l); err != nil || l.Len() != 2 {
		t.Fatal("lookup", l.Len(), err)
	}
	m.Plan(&l)
	if err := m.Onboard(&l); err != nil {
		t.Fatal(err)
	}
	err = m.Wait(context.Background(), &l)
	if !errors.Is(err, ErrMove) || !strings.Contains(err.Error(), "shard 1: queue closed") {
		t.Fatalf("Wait with shard 1's Submit failing = %v, want ErrMove naming shard 1", err)
	}
	m.Release(&l)
	mt := m.Metrics()
	if mt.Tiers[GPU].ResidentBlocks != 0 || mt.Tiers[Host].ResidentBlocks != 2 {
		t.Fatalf("after a failed sharded load: %d blocks in the GPU, %d in the host; want 0 and 2", mt.Tiers[GPU].ResidentBlocks, mt.Tiers[Host].ResidentBlocks)
	}
	m.check(t)
}
