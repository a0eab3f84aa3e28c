package kvtier

// MoveOp is one block copy between two tiers.
type MoveOp struct {
	// Key and Ref name the block (for the mover's errors and logs).
	Key Key
	Ref BlockRef
	// From and FromSlot are the source; the source slot is ready and the
	// manager keeps it from being evicted or reused until the op completes.
	From     Tier
	FromSlot Slot
	// To and ToSlot are the destination; the block is not readable from it
	// until the op completes without error (invariant 2).
	To     Tier
	ToSlot Slot
}

// Mover performs the copies the manager decides on: kvtier/transfer for GPU
// and host memory, composed with kvtier/nvme for the NVMe tier (an op with
// From or To NVMe reads or writes slot ToSlot of the slab files, through a
// pinned staging buffer, and completes only once the write is checksummed and
// durable).
type Mover interface {
	// Submit starts the copies in t.Ops. It is called without the manager's
	// lock held. The mover MUST call t.Complete(i, err) exactly once for
	// every op i, from any goroutine, in any order, possibly before Submit
	// returns, and MUST NOT touch either slot of op i after completing it
	// (invariant 3). The mover MUST NOT keep t after its last Complete.
	// An error from Submit fails every op it has not completed.
	Submit(t *Transfer) error
}

// Transfer is a batch of copies handed to the Mover. The manager owns it and
// reuses it after its last op completes.
type Transfer struct {
	// Ops are the copies; the mover MUST NOT modify the slice.
	Ops []MoveOp

	m         *Manager
	lease     *Lease // nil for background demotions and write-through
	done      []bool // per op; guarded by the write lock, like remaining
	remaining int
}

// Complete reports op i done (err nil: the destination slot holds the block,
// durably for NVMe) or failed. It takes the manager's lock, and may start
// the next copies (write-through, demotion) by calling Submit again, so a
// mover MUST NOT call it while holding a lock its Submit takes.
func (t *Transfer) Complete(i int, err error) {
	t.m.complete(t, i, err)
}
