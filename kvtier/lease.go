package kvtier

import (
	"context"
	"fmt"
	"math"
)

// Block is one block of a Lease.
type Block struct {
	Key      Key
	Ref      BlockRef
	Position int  // the block's index in the request (holes: Config.MaxHoleBlocks)
	Tier     Tier // where it is ready: Lookup's fastest tier, or Insert's
	Slot     Slot
	Action   Action // the Planner's, or Recompute where Onboard could not load it
	Why      Reason
	Write    bool // Insert reserved Slot: the caller MUST write the KV, then Commit
	GPUSlot  Slot // where Onboard loads it, when Loading
	Loading  bool
}

// Lease holds references on the blocks a Lookup or Insert returned, so that
// none of them is evicted until Release. A Lease is reusable and owns its
// buffers, so a request path that reuses one allocates nothing. A Lease MUST
// NOT be used by two goroutines at once, and the caller MUST Release it before
// the next Lookup or Insert into it.
type Lease struct {
	// Blocks are the leased blocks, in request order. Read only.
	Blocks []Block

	keys      []Key       // the request's keys (Lookup by tokens hashes into it)
	requested int         // full blocks the last lookup asked for
	tokens    int         // the request's tokens, for Plan
	buf       []byte      // hashing scratch
	hashes    []uint32    // Insert's token hashes of its blocks (tokenHash)
	plan      []PlanBlock // Plan scratch
	actions   []Action    // Plan scratch
	req       PlanRequest // Plan scratch
	estimate  Estimate    // the last Plan's
	touches   []touch     // Release scratch
	stripe    uint32      // 1 + index of the manager stripe this lease uses; 0: none yet

	// Owned by the lease's user, like Blocks: the Mover adds layers
	// during the Submit that Onboard makes (Batch.AddLayers).
	layers  []Layers
	written Event // CommitAfter's event, until Release

	// Guarded by the manager's write lock (pinned and activeAt: by the
	// lease's stripe, see stripe.go).
	xfers    int   // transfers of this lease in flight
	err      error // first failure since the last Wait
	done     chan struct{}
	m        *Manager
	leased   bool
	pinned   bool // in its stripe's active list, holding no references yet
	activeAt int  // its index there
	lookup   bool // Release must record the lookup's uses
	quiet    bool // the lookup of a Pin or Unpin: not counted in Metrics
}

// Len is the number of leased blocks.
func (l *Lease) Len() int { return len(l.Blocks) }

// SetTokens tells Plan how many tokens the looked-up request has when the
// lookup did not see them all (a LookupKeys, or a tail always computed): n
// MUST be more than (len(keys)-1)*BlockTokens and at most 2^31, or nothing
// changes and it returns an error.
func (l *Lease) SetTokens(n int) error {
	if !l.leased || !l.lookup || l.m == nil {
		return fmt.Errorf("%w: SetTokens: the lease holds no lookup", ErrBadInput)
	}
	bt := l.m.blockTokens
	if k := len(l.keys); n <= (k-1)*bt || n > math.MaxInt32 {
		return fmt.Errorf("%w: SetTokens: %d tokens for %d keys of %d-token blocks", ErrBadInput, n, k, bt)
	}
	l.tokens = n
	return nil
}

// Estimate is the Planner's estimate of the request's prefill, from the
// last Plan (zero before one, or when the planner has no model).
func (l *Lease) Estimate() Estimate { return l.estimate }

// LayerEvents appends to dst the device events that complete when layer
// `layer` of every block Onboard is loading for l is on the GPU, valid until
// Release; none when the mover reports no layers (then use Manager.Wait).
func (l *Lease) LayerEvents(layer int, dst []Event) ([]Event, error) {
	for _, ly := range l.layers {
		if layer < 0 || layer >= ly.NumLayers() {
			return dst, fmt.Errorf("%w: LayerEvents: layer %d outside the model's %d", ErrBadInput, layer, ly.NumLayers())
		}
		dst = append(dst, ly.LayerEvent(layer))
	}
	return dst, nil
}

// ShardLayerEvents is LayerEvents for one GPU (by rank) of a ShardedMover;
// with another mover it appends nothing.
func (l *Lease) ShardLayerEvents(shard, layer int, dst []Event) ([]Event, error) {
	if shard < 0 {
		return dst, fmt.Errorf("%w: ShardLayerEvents: shard %d is negative", ErrBadInput, shard)
	}
	for _, ly := range l.layers {
		sl, ok := ly.(shardLayers)
		if !ok || sl.Shard != shard {
			continue
		}
		if layer < 0 || layer >= ly.NumLayers() {
			return dst, fmt.Errorf("%w: ShardLayerEvents: layer %d outside the model's %d", ErrBadInput, layer, ly.NumLayers())
		}
		dst = append(dst, ly.LayerEvent(layer))
	}
	return dst, nil
}

// WaitLayer is LayerEvents for CPU users of the KV: it blocks until the
// layer is on the GPU and returns the loads' error or ctx's.
func (l *Lease) WaitLayer(ctx context.Context, layer int) error {
	for _, ly := range l.layers {
		if layer < 0 || layer >= ly.NumLayers() {
			return fmt.Errorf("%w: WaitLayer: layer %d outside the model's %d", ErrBadInput, layer, ly.NumLayers())
		}
		if err := ly.WaitLayer(ctx, layer); err != nil {
			return fmt.Errorf("kvtier: WaitLayer %d: %w", layer, err)
		}
	}
	return nil
}

// dropLayers releases the layers the mover reported for l.
func (l *Lease) dropLayers() {
	for i, ly := range l.layers {
		ly.Release()
		l.layers[i] = nil
	}
	l.layers = l.layers[:0]
}
