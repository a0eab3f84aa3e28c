package kvtier

import "context"

// MoveOp is one block copy between two tiers. It carries everything a mover
// needs to know of the block, so that a mover is a plain client of this
// contract and never reads the manager's state.
type MoveOp struct {
	// Key and Ref name the block (for the mover's errors and logs).
	Key Key
	Ref BlockRef
	// Parent, Salt and Position identify the block for a tier that stores
	// it self-described (the NVMe header): its predecessor's key, its salt
	// and its block index in the request.
	Parent   Key
	Salt     Salt
	Position int
	// Tokens are the block's token ids, or nil when it was inserted by key.
	// The slice is the manager's: read only, valid until the op completes.
	Tokens []int32
	// From and FromSlot are the source; the source slot is ready and the
	// manager keeps it from being evicted or reused until the op completes.
	From     Tier
	FromSlot Slot
	// To and ToSlot are the destination; the block is not readable from it
	// until the op completes without error (invariant 2).
	To     Tier
	ToSlot Slot
	// After, for a copy out of the GPU, is the server's event that marks
	// the block's KV as written (CommitAfter), or nil when it was written
	// already: the copy MUST wait for it on the device.
	After Event
}

// Event is a point in device work that has or has not completed: a
// cudastream.Event satisfies it. The manager only passes events between the
// server and the Mover; it never waits on one on a request's path.
type Event interface {
	// Query reports whether the work captured by the event has completed.
	Query() (bool, error)
	// Synchronize blocks the host until it has.
	Synchronize() error
}

// Layers is the per-layer readiness of the loads into the GPU that a Mover
// started for one Batch: layer l of each block it loads is on the GPU once
// LayerEvent(l) has completed. A model runs layer l as soon as its layer is
// there, while the later layers still load.
type Layers interface {
	// NumLayers is the model's layer count.
	NumLayers() int
	// LayerEvent returns the event that completes when layer l has landed;
	// a compute stream waits on it (cuStreamWaitEvent) without blocking
	// the host. It stays valid until Release. For loads the mover must
	// first read from a slower tier (NVMe staged through host buffers) it
	// returns once those reads are done and the copies enqueued: the host
	// waits for the drive, never for a copy.
	LayerEvent(l int) Event
	// WaitLayer blocks the host until layer l has landed, and returns the
	// loads' error if they failed, or ctx's error first if ctx ends.
	WaitLayer(ctx context.Context, l int) error
	// Release says that the manager hands out no more of these events; the
	// mover may reuse them once its copies have also completed. The
	// manager calls it exactly once.
	Release()
}

// Mover performs the copies the manager decides on: kvtier/transfer for GPU
// and host memory, composed with kvtier/nvme for the NVMe tier (an op with
// From or To NVMe reads or writes slot ToSlot of the slab files, through a
// pinned staging buffer, and completes only once the write is checksummed and
// durable).
type Mover interface {
	// Submit starts the copies in b.Ops. It is called without the manager's
	// lock held. The mover MUST call b.Complete(i, err) exactly once for
	// every op i, from any goroutine, in any order, possibly before Submit
	// returns, and MUST NOT touch either slot of op i after completing it
	// (invariant 3). A copy out of the GPU MUST start on the device only
	// after its op's After (when set) has completed, and MUST NOT wait for
	// it on the host. A mover that loads into the GPU layer by layer reports it
	// with b.AddLayers before Submit returns and before its last Complete.
	// The mover MUST NOT keep b after its last Complete. An error from
	// Submit fails every op it has not completed.
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

// Relay receives the completions and layer readiness of a Batch made by
// NewRelayBatch, in place of a manager. A Mover that wraps others (one per
// GPU rank, as ShardedMover; one per tier; one that observes each copy)
// hands them batches of its own and passes on what they report to the
// batch it was given, after its own bookkeeping. The calls come as the
// Mover contract makes them: Complete exactly once per op, from any
// goroutine; AddLayers during Submit, before the last Complete.
type Relay interface {
	Complete(i int, err error)
	AddLayers(ly Layers)
}

// NewRelayBatch returns a Batch of ops whose Complete and AddLayers calls
// go to r. ops is the batch's and MUST NOT change until its last op
// completes.
func NewRelayBatch(ops []MoveOp, r Relay) *Batch { return &Batch{Ops: ops, relay: r} }

// Lease returns the lease whose call asked for these copies (Onboard,
// Offload, Promote, or Commit's write-through), or nil for the manager's
// own (demotions, copies started by a completion): a Mover that accounts
// copies per request (a replay, a tracer) tells requests apart by it. The
// Mover MUST NOT call the lease's methods.
func (b *Batch) Lease() *Lease { return b.lease }

// Complete reports op i done (err nil: the destination slot holds the block,
// durably for NVMe) or failed. It takes the manager's lock, and may start
// the next copies (write-through, demotion) by calling Submit again, so a
// mover MUST NOT call it while holding a lock its Submit takes.
func (b *Batch) Complete(i int, err error) {
	if b.relay != nil {
		b.relay.Complete(i, err)
		return
	}
	b.m.complete(b, i, err)
}

// AddLayers hands the manager the per-layer readiness of loads into the GPU
// that the mover started for b. The lease that asked for the loads hands
// them out (Lease.LayerEvents, Lease.WaitLayer) until it is released, and
// then calls ly.Release. It MUST be called during Submit, before b's last
// Complete.
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
