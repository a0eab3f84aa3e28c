package kvtier

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
)

// The model test drives the manager from many goroutines with random
// lookups, onboards, inserts, commits (some failing), offloads and releases,
// while a fake mover completes copies in random order (some failing). The
// reference model is the content each (salt, token prefix) must have: every
// slot write and copy carries it, so any hit whose slot holds other content
// (a collision served, a block readable before its copy completed, a slot
// reused while copied or in use) fails the test. Invariant walks run under
// the invariants tag after each state change and at quiescent points here.

const modelBT = 2

// content is the reference identity of block i of a request: a hash, made
// independently of the manager's keys, of the salt and all tokens up to and
// including block i.
func content(salt Salt, tokens []int32, i int) Key {
	h := fnv.New64a()
	var b [4]byte
	for j := range 8 {
		b[0] = byte(salt >> (8 * j))
		h.Write(b[:1])
	}
	for _, tok := range tokens[:(i+1)*modelBT] {
		b[0], b[1], b[2], b[3] = byte(tok), byte(tok>>8), byte(tok>>16), byte(tok>>24)
		h.Write(b[:])
	}
	return Key(h.Sum64() | 1) // never 0, the fake's empty slot
}

type modelWorld struct {
	m      *Manager
	shards []*fakeMover // one per GPU; a single-GPU manager has one
	docs   [][]int32
	t      *testing.T
}

// write stores what a prefill wrote into a slot, on every GPU.
func (w *modelWorld) write(t Tier, s Slot, k Key) {
	for _, f := range w.shards {
		f.write(t, s, k)
	}
}

// read returns the content of a slot, or a description of the shards'
// disagreement.
func (w *modelWorld) read(t Tier, s Slot) (Key, string) {
	k := w.shards[0].read(t, s)
	for j, f := range w.shards[1:] {
		if o := f.read(t, s); o != k {
			return 0, fmt.Sprintf("shard 0 holds %#x, shard %d %#x", k, j+1, o)
		}
	}
	return k, ""
}

// checkAllOrNone checks that every block ready in a tier is there on every
// GPU: all shards hold the same content in its slot.
func (w *modelWorld) checkAllOrNone() {
	w.m.Range(func(b BlockInfo) bool {
		for tier := range NumTiers {
			if !b.Ready[tier] {
				continue
			}
			if _, bad := w.read(tier, b.Slot[tier]); bad != "" {
				w.t.Errorf("block %#x is ready in %v slot %d, but not on every GPU: %s", uint64(b.Key), tier, b.Slot[tier], bad)
			}
		}
		return true
	})
}

type heldLease struct {
	l      *Lease
	salt   Salt
	tokens []int32
	loaded bool // Onboard completed without error
}

type modelWorker struct {
	w    *modelWorld
	rng  *rand.Rand
	held []heldLease
	free []*Lease
}

func (k *modelWorker) lease() *Lease {
	if n := len(k.free); n > 0 {
		l := k.free[n-1]
		k.free = k.free[:n-1]
		return l
	}
	return new(Lease)
}

func (k *modelWorker) request() (Salt, []int32) {
	doc := k.w.docs[k.rng.IntN(len(k.w.docs))]
	n := 1 + k.rng.IntN(len(doc)/modelBT)
	tok := append([]int32(nil), doc[:n*modelBT]...)
	if k.rng.IntN(5) == 0 { // branch off at a random token
		tok[k.rng.IntN(len(tok))] = int32(k.rng.IntN(4))
	}
	return Salt(k.rng.IntN(3)), tok
}

// verify checks every leased block's slot holds the reference content.
func (k *modelWorker) verify(h heldLease) {
	w := k.w
	for i, b := range h.l.Blocks {
		want := content(h.salt, h.tokens, i)
		if b.Write {
			continue // not written yet
		}
		if got, bad := w.read(b.Tier, b.Slot); got != want {
			k.w.t.Errorf("block %d of a lease: %v slot %d holds %#x, want %#x%s", i, b.Tier, b.Slot, got, want, bad)
		}
		if h.loaded && b.Loading {
			if got, bad := w.read(GPU, b.GPUSlot); got != want {
				k.w.t.Errorf("block %d loaded into gpu slot %d holds %#x, want %#x%s", i, b.GPUSlot, got, want, bad)
			}
		}
	}
}

func (k *modelWorker) release(h heldLease) {
	k.verify(h)
	k.w.m.Release(h.l)
	k.free = append(k.free, h.l)
}

func (k *modelWorker) keepOrRelease(h heldLease) {
	if len(k.held) < 3 && k.rng.IntN(3) == 0 {
		k.held = append(k.held, h)
		return
	}
	k.release(h)
}

func (k *modelWorker) step() {
	m, rng := k.w.m, k.rng
	switch op := rng.IntN(10); {
	case op < 4: // lookup, maybe onboard
		salt, tok := k.request()
		h := heldLease{l: k.lease(), salt: salt, tokens: tok}
		if err := m.Lookup(salt, tok, h.l); err != nil {
			k.w.t.Error(err)
			return
		}
		k.verify(h)
		if rng.IntN(2) == 0 {
			m.Plan(h.l)
			if err := m.Onboard(h.l); err != nil {
				k.w.t.Error(err)
			}
			err := m.Wait(context.Background(), h.l)
			if err != nil && !errors.Is(err, ErrMove) {
				k.w.t.Error(err)
			}
			h.loaded = err == nil
			k.verify(h)
		}
		k.keepOrRelease(h)
	case op < 8: // insert into a random tier, maybe offload
		salt, tok := k.request()
		tier := Tier(rng.IntN(int(NumTiers)))
		h := heldLease{l: k.lease(), salt: salt, tokens: tok}
		if err := m.Insert(salt, tok, tier, h.l); err != nil && !errors.Is(err, ErrNoSpace) {
			k.w.t.Error(err)
		}
		for i, b := range h.l.Blocks {
			if b.Write {
				k.w.write(b.Tier, b.Slot, content(salt, tok, i))
			}
		}
		var werr error
		if rng.IntN(20) == 0 {
			werr = errors.New("prefill failed")
		}
		if err := m.Commit(h.l, werr); err != nil {
			k.w.t.Error(err)
		}
		if werr != nil {
			m.Release(h.l) // the failed blocks are forgotten: nothing to verify
			k.free = append(k.free, h.l)
			return
		}
		// Blocks another lease is writing may not be ready yet: do not
		// verify this lease's blocks, only copy them on.
		if tier < NVMe && rng.IntN(3) == 0 {
			if err := m.Offload(h.l, tier+1+Tier(rng.IntN(int(NVMe-tier)))); err != nil {
				k.w.t.Error(err)
			}
			if err := m.Wait(context.Background(), h.l); err != nil && !errors.Is(err, ErrMove) {
				k.w.t.Error(err)
			}
		}
		m.Release(h.l)
		k.free = append(k.free, h.l)
	default: // release a held lease
		if len(k.held) > 0 {
			i := rng.IntN(len(k.held))
			h := k.held[i]
			k.held = append(k.held[:i], k.held[i+1:]...)
			k.release(h)
		}
	}
	for t := range NumTiers {
		if mt := m.Metrics().Tiers[t]; mt.ResidentBlocks > mt.CapacitySlots {
			k.w.t.Errorf("%v holds %d blocks, capacity %d", t, mt.ResidentBlocks, mt.CapacitySlots)
		}
	}
	if len(k.w.shards) > 1 {
		k.w.checkAllOrNone()
	}
}

// runModel runs the model test on a manager over shards GPUs: with more
// than one, a ShardedMover fans each op out to one fake mover per GPU, whose
// copies complete (or fail) independently, and the all-or-none invariant is
// checked after every step.
func runModel(t *testing.T, writeThrough bool, shards, workers, steps int, seed uint64) {
	notify := make(chan struct{}, 1)
	fs := make([]*fakeMover, shards)
	movers := make([]Mover, shards)
	for j := range fs {
		fs[j] = newFakeMover()
		fs[j].notify = notify
		movers[j] = fs[j]
	}
	var mover Mover = fs[0]
	if shards > 1 {
		sm, err := NewShardedMover(movers...)
		if err != nil {
			t.Fatal(err)
		}
		mover = sm
	}
	cfg := Config{BlockTokens: modelBT, Mover: mover, WriteThrough: writeThrough, EventBuffer: 1 << 20}
	cfg.Tiers[GPU] = tierCfg(t, 6)
	cfg.Tiers[Host] = tierCfg(t, 12)
	cfg.Tiers[NVMe] = tierCfg(t, 24)
	cfg.Tiers[NVMe].Admitter = &countAdmitter{seen: map[Key]int{}}
	m := mustNew(t, cfg)
	events := followEvents(t, m) // a router's index of the blocks, checked at the end
	rng := rand.New(rand.NewPCG(seed, 0))
	w := &modelWorld{m: m, shards: fs, t: t}
	for range 10 {
		doc := make([]int32, modelBT*(1+rng.IntN(6)))
		for i := range doc {
			doc[i] = int32(rng.IntN(4)) // small alphabet: many shared prefixes
		}
		w.docs = append(w.docs, doc)
	}

	stop := make(chan struct{})
	var completer sync.WaitGroup
	completer.Add(1)
	go func() {
		defer completer.Done()
		crng := rand.New(rand.NewPCG(seed, 1))
		for {
			// A random GPU's random copy: the shards' copies of one op
			// complete in any order, and fail independently.
			completed := false
			for _, j := range crng.Perm(shards) {
				if fs[j].completeOne(crng, crng.IntN(20) == 0) {
					completed = true
					break
				}
			}
			if completed {
				continue
			}
			select {
			case <-notify:
			case <-stop:
				return
			}
		}
	}()
	var wg sync.WaitGroup
	ks := make([]*modelWorker, workers)
	for i := range ks {
		ks[i] = &modelWorker{w: w, rng: rand.New(rand.NewPCG(seed, uint64(i)+2))}
		wg.Add(1)
		go func(k *modelWorker) {
			defer wg.Done()
			for range steps {
				k.step()
			}
		}(ks[i])
	}
	wg.Wait()
	close(stop)
	completer.Wait()
	for _, k := range ks {
		for _, h := range k.held {
			k.release(h)
		}
	}
	for drained := false; !drained; {
		drained = true
		for _, f := range fs {
			if f.len() > 0 {
				f.drain()
				drained = false
			}
		}
	}
	m.check(t)
	events()
	if shards > 1 {
		w.checkAllOrNone()
	}
	mt := m.Metrics()
	for tier := range NumTiers {
		if mt.Tiers[tier].InUseBlocks != 0 {
			t.Errorf("%v: %d blocks in use at rest", tier, mt.Tiers[tier].InUseBlocks)
		}
	}
	// Every block the manager still holds serves the right content.
	k := &modelWorker{w: w, rng: rng}
	for _, doc := range w.docs {
		for salt := range Salt(3) {
			h := heldLease{l: k.lease(), salt: salt, tokens: doc}
			if err := m.Lookup(salt, doc, h.l); err != nil {
				t.Fatal(err)
			}
			k.release(h)
		}
	}
	if mt.Lookups == 0 || mt.HitBlocks == 0 || mt.Tiers[GPU].Evictions == 0 || mt.MoveFailures == 0 {
		t.Errorf("the run exercised too little: %+v", mt)
	}
	t.Logf("%d lookups, %d of %d blocks hit, %d move failures, evictions %d/%d/%d, demotions %d/%d",
		mt.Lookups, mt.HitBlocks, mt.LookupBlocks, mt.MoveFailures,
		mt.Tiers[GPU].Evictions, mt.Tiers[Host].Evictions, mt.Tiers[NVMe].Evictions,
		mt.Tiers[GPU].Demotions, mt.Tiers[Host].Demotions)
}

func TestModelRandomized(t *testing.T) {
	steps := 1500
	if os.Getenv("KVTIER_LONG") != "" {
		steps = 50000
	}
	for _, wt := range []bool{false, true} {
		name := "writeback"
		if wt {
			name = "writethrough"
		}
		t.Run(name, func(t *testing.T) {
			for seed := range uint64(2) {
				runModel(t, wt, 1, 8, steps, seed+1)
			}
		})
	}
}

// TestShardedModelRandomized is the model test of tensor-parallel managers
// (TP 2, 4 and 8 on fake movers): every block ready in a tier is there on
// every GPU, checked after every step, while each GPU's copies complete and
// fail on their own.
func TestShardedModelRandomized(t *testing.T) {
	steps := 800
	if os.Getenv("KVTIER_LONG") != "" {
		steps = 20000
	}
	for _, tp := range []int{2, 4, 8} {
		for _, wt := range []bool{false, true} {
			t.Run(fmt.Sprintf("tp=%d/writethrough=%v", tp, wt), func(t *testing.T) {
				runModel(t, wt, tp, 8, steps, uint64(tp))
			})
		}
	}
}
