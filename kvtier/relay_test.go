package kvtier

import (
	"sync"
	"testing"
)

// observedMover wraps a Mover with NewRelayBatch: it counts each op's
// completion by outcome, then passes it on to the manager's batch.
type observedMover struct {
	inner Mover
	mu    sync.Mutex
	ok    int
	fail  int
	// failKey fails, in the relay, the copies of this block (0: none).
	failKey Key
}

type observedBatch struct {
	o      *observedMover
	parent *Batch
}

func (o *observedMover) Submit(b *Batch) error {
	return o.inner.Submit(NewRelayBatch(b.Ops, &observedBatch{o: o, parent: b}))
}

func (r *observedBatch) Complete(i int, err error) {
	o := r.o
	o.mu.Lock()
	if err == nil && o.failKey != 0 && r.parent.Ops[i].Key == o.failKey {
		err = errMoveTest
	}
	if err == nil {
		o.ok++
	} else {
		o.fail++
	}
	o.mu.Unlock()
	r.parent.Complete(i, err)
}

func (r *observedBatch) AddLayers(ly Layers) { r.parent.AddLayers(ly) }
func (r *observedBatch) Wanted(i int) bool   { return r.parent.Wanted(i) }

// TestRelayBatchPassesCompletionsOn: a Mover that wraps another through
// NewRelayBatch sees every completion, in place of the manager, and what it
// passes on is what the manager acts on: a copy it fails leaves the
// destination empty, the others land.
func TestRelayBatchPassesCompletionsOn(t *testing.T) {
	f := newFakeMover()
	f.inline = true
	o := &observedMover{inner: f}
	cfg := Config{BlockTokens: 2, Mover: o, WriteThrough: true}
	cfg.Tiers[GPU] = tierCfg(t, 8)
	cfg.Tiers[Host] = tierCfg(t, 8)
	m := mustNew(t, cfg)
	a := toks(3, 2, 0)
	var l Lease
	if err := m.Insert(0, a, GPU, &l); err != nil || l.Len() != 3 {
		t.Fatalf("insert: %d blocks, %v", l.Len(), err)
	}
	o.failKey = l.Blocks[1].Key
	if err := m.Commit(&l, nil); err != nil { // write-through: three copies to the host
		t.Fatal(err)
	}
	m.Release(&l)
	if o.ok != 2 || o.fail != 1 {
		t.Fatalf("the relay saw %d copies done and %d failed, want 2 and 1", o.ok, o.fail)
	}
	mt := m.Metrics()
	if got := mt.Tiers[Host].ResidentBlocks; got != 2 {
		t.Errorf("host tier holds %d blocks, want the 2 copies the relay passed on as done", got)
	}
	if mt.Tiers[GPU].ResidentBlocks != 3 {
		t.Errorf("GPU tier holds %d blocks, want 3", mt.Tiers[GPU].ResidentBlocks)
	}
	m.check(t)
}
