package kvtier

import "context"

// MoveOp is one block copy between two tiers. It carries everything a mover
// needs to know of the block, so that a mover is a plain client of this
// contract and never reads the manager's state.
type MoveOp struct {
	Key Key
	Ref BlockRef
	// Parent, Salt, Position and Tokens (nil if inserted by key; read
	// only) describe the block to a tier that stores them (NVMe headers).
	Parent   Key
	Salt     Salt
	Position int
	Tokens   []int32
	// The source stays ready until the op completes; the destination is
	// readable once it completes without error.
	From, To         Tier
	FromSlot, ToSlot Slot
	// After, for a copy out of the GPU, is CommitAfter's event, or nil:
	// the copy MUST wait for it on the device, never on the host.
	After Event
}

// Event is a point in device work (a cudastream.Event). The manager passes
// events between the server and the Mover and never waits on one on a
// request's path.
type Event interface {
	Query() (bool, error) // whether the captured work has completed
	Synchronize() error   // block the host until it has
}

// Layers is the per-layer readiness of the loads into the GPU that a Mover
// started for one Batch, so that a model runs layer l while later layers
// still load.
type Layers interface {
	NumLayers() int
	// LayerEvent completes when layer l has landed; valid until Release
	// (for loads staged from NVMe, returned once the drive was read).
	LayerEvent(l int) Event
	// WaitLayer blocks until layer l has landed: the loads' error, or ctx's.
	WaitLayer(ctx context.Context, l int) error
	// Release: the manager hands out no more of these events (called once).
	Release()
}

// Mover performs the copies the manager decides on (kvtier/devmover on a
// device). A copy into NVMe completes only once checksummed and durable.
type Mover interface {
	// Submit starts the copies in b.Ops, called without the manager's lock.
	// The mover MUST call b.Complete(i, err) exactly once for every op i
	// (from any goroutine, possibly before Submit returns), MUST NOT touch
	// op i's slots after that, and reports loads' layers with b.AddLayers
	// before Submit returns. An error fails every op not yet completed.
	Submit(b *Batch) error
}

// Batch is a set of copies handed to the Mover at once. The manager owns it
// and reuses it after its last op completes.
type Batch struct {
	// Ops are the copies; the mover MUST NOT modify the slice.
	Ops []MoveOp

	m         *Manager
	lease     *Lease // nil for background demotions and write-through
	done      []bool // per op; guarded by the write lock, like remaining
	remaining int

	// relay, when set, gets the completions and layers instead of the
	// manager (NewRelayBatch; a ShardedMover's per-shard batches).
	relay Relay
}

// Relay receives, in place of a manager, what the Mover reports of a Batch
// made by NewRelayBatch: a Mover that wraps others (ShardedMover) passes it on.
type Relay interface {
	Complete(i int, err error)
	AddLayers(ly Layers)
	Wanted(i int) bool // Batch.Wanted of the relayed op
}

// NewRelayBatch returns a Batch of ops whose Complete and AddLayers calls
// go to r. ops is the batch's and MUST NOT change until its last op
// completes.
func NewRelayBatch(ops []MoveOp, r Relay) *Batch { return &Batch{Ops: ops, relay: r} }

// Lease returns the lease whose call asked for these copies, or nil for
// the manager's own (demotions, copies a completion starts): a Mover that
// accounts copies per request tells requests apart by it, and MUST NOT call
// the lease's methods.
func (b *Batch) Lease() *Lease { return b.lease }

// Complete reports op i done (err nil: the destination holds the block,
// durably for NVMe) or failed. It takes the manager's lock and may call
// Submit again, so a mover MUST NOT call it holding a lock Submit takes.
func (b *Batch) Complete(i int, err error) {
	if b.relay != nil {
		b.relay.Complete(i, err)
		return
	}
	b.m.complete(b, i, err)
}

// AddLayers hands the manager the per-layer readiness of the loads the
// mover started for b, during Submit and before b's last Complete. The
// lease hands the events out until it is released, then calls ly.Release.
func (b *Batch) AddLayers(ly Layers) {
	if b.relay != nil {
		b.relay.AddLayers(ly)
		return
	}
	if l := b.lease; l != nil {
		l.layers = append(l.layers, ly)
		return
	}
	ly.Release()
}
