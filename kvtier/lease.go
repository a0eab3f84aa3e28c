package kvtier

// Block is one block of a Lease.
type Block struct {
	// Key and Ref identify the block.
	Key Key
	Ref BlockRef
	// Tier and Slot are where the block is ready: after Lookup the fastest
	// tier holding it; after Insert the tier inserted into.
	Tier Tier
	Slot Slot
	// Action is the Planner's decision (after Plan).
	Action Action
	// Write is set by Insert when this lease reserved the slot: the caller
	// MUST write the block's KV into Slot of Tier and then call Commit. A
	// block already ready (or being written by another lease) has it clear.
	Write bool
	// GPUSlot is where Onboard loads the block (valid when Loading is set).
	GPUSlot Slot
	// Loading is set by Onboard for a block whose copy into the GPU it
	// submitted; the copy is done when Wait returns nil.
	Loading bool
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
	buf       []byte      // hashing scratch
	plan      []PlanBlock // Plan scratch
	actions   []Action    // Plan scratch
	touches   []touch     // Release scratch
	stripe    uint32      // 1 + index of the manager stripe this lease uses; 0: none yet

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
}

// Len is the number of leased blocks.
func (l *Lease) Len() int { return len(l.Blocks) }
