package kvtier

import (
	"fmt"
	"sync"

	"kvtier.dev/internal/invariants"
)

// ShardedMover is a tensor-parallel server's Mover: it fans every op out to
// one Mover per GPU and completes it when every shard has, so a block is in a
// tier on every GPU or on none (docs/design-notes.md, "Tensor parallelism").
type ShardedMover struct {
	shards []Mover
	fans   sync.Pool // *fanout
}

// NewShardedMover returns a mover over one Mover per GPU, in the order of
// the server's ranks.
func NewShardedMover(shards ...Mover) (*ShardedMover, error) {
	if len(shards) == 0 {
		return nil, fmt.Errorf("%w: NewShardedMover: no shard", ErrBadInput)
	}
	for i, s := range shards {
		if s == nil {
			return nil, fmt.Errorf("%w: NewShardedMover: shard %d is nil", ErrBadInput, i)
		}
	}
	return &ShardedMover{shards: append([]Mover(nil), shards...)}, nil
}

// Shards is the number of GPUs.
func (s *ShardedMover) Shards() int { return len(s.shards) }

// shardLayers is the per-layer readiness of one shard's loads under a
// ShardedMover: Shard is the GPU's rank.
type shardLayers struct {
	Layers
	Shard int
}

// fanout tracks one Batch across the shards. Each op has a count of what it
// still waits for: one per shard, plus one that Submit holds until every
// shard's Submit has returned, so that the parent's last Complete cannot
// come before the shards' AddLayers calls (the Mover contract).
type fanout struct {
	s      *ShardedMover
	parent *Batch
	subs   []Batch      // one per shard, sharing parent.Ops
	relays []shardRelay // subs[j]'s relay

	mu   sync.Mutex
	left []int32 // per op
	errs []error // per op: the first shard's error
	done []bool  // per shard and op: shard*len(ops)+op has completed
}

// Submit implements Mover.
func (s *ShardedMover) Submit(b *Batch) error {
	n := len(b.Ops)
	if n == 0 {
		return nil
	}
	f, _ := s.fans.Get().(*fanout)
	if f == nil {
		f = &fanout{s: s, subs: make([]Batch, len(s.shards)), relays: make([]shardRelay, len(s.shards))}
		for j := range f.relays {
			f.relays[j] = shardRelay{f: f, shard: j}
		}
	}
	f.parent = b
	f.left = resize(f.left, n)
	f.errs = resize(f.errs, n)
	f.done = resize(f.done, n*len(s.shards))
	for i := range f.left {
		f.left[i] = int32(len(s.shards)) + 1
	}
	for j, mv := range s.shards {
		sb := &f.subs[j]
		*sb = Batch{Ops: b.Ops, relay: &f.relays[j]}
		if err := mv.Submit(sb); err != nil {
			// The shard fails what it has not completed, and will not
			// complete it: do it for the shard.
			for i := range n {
				f.mu.Lock()
				done := f.done[j*n+i]
				f.mu.Unlock()
				if !done {
					f.complete(j, i, err)
				}
			}
		}
	}
	for i := range n {
		f.release(i)
	}
	return nil
}

// shardRelay is the Relay of shard j's batch: its calls go to the fan-out.
type shardRelay struct {
	f     *fanout
	shard int
}

func (r *shardRelay) Complete(i int, err error) { r.f.complete(r.shard, i, err) }
func (r *shardRelay) AddLayers(ly Layers)       { r.f.addLayers(r.shard, ly) }
func (r *shardRelay) Wanted(i int) bool         { return r.f.parent.Wanted(i) }

// complete records shard j's completion of op i.
func (f *fanout) complete(j, i int, err error) {
	n := len(f.parent.Ops)
	f.mu.Lock()
	if i < 0 || i >= n || f.done[j*n+i] {
		f.mu.Unlock()
		invariants.Failf("ShardedMover: shard %d completed op %d twice or out of range (%d ops)", j, i, n)
	}
	f.done[j*n+i] = true
	if err != nil && f.errs[i] == nil {
		f.errs[i] = fmt.Errorf("shard %d: %w", j, err)
	}
	f.mu.Unlock()
	f.release(i)
}

// release drops one of op i's counts and completes it in the parent at zero;
// the last op to complete returns f to the pool.
func (f *fanout) release(i int) {
	f.mu.Lock()
	f.left[i]--
	last, err := f.left[i] == 0, f.errs[i]
	finished := false
	if last {
		finished = true
		for _, l := range f.left {
			if l != 0 {
				finished = false
				break
			}
		}
	}
	parent := f.parent
	f.mu.Unlock()
	if !last {
		return
	}
	if finished {
		// Every op has reached zero: nothing of f is touched after this
		// point but the parent, which the Manager owns.
		s := f.s
		f.parent = nil
		clear(f.errs)
		clear(f.subs)
		defer s.fans.Put(f)
	}
	parent.Complete(i, err)
}

// addLayers hands shard j's layers to the parent batch, tagged with the
// shard.
func (f *fanout) addLayers(j int, ly Layers) {
	f.parent.AddLayers(shardLayers{Layers: ly, Shard: j})
}

// resize returns s with length n, reusing its array when it is big enough,
// zeroed.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}
