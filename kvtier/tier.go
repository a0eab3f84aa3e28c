package kvtier

import "fmt"

// Tier names one level of the KV hierarchy, fastest first.
type Tier uint8

const (
	GPU      Tier = iota // device memory: the blocks attention reads
	Host                 // the pinned host pool
	NVMe                 // slab files on local drives
	NumTiers             // counts the tiers; not a tier

	// Remote names the shared remote tier (kvtier/remotetier) in events.
	// The manager holds nothing there: no method takes it as a tier.
	Remote = NumTiers
)

// String returns the tier's name as it appears in errors and metrics.
func (t Tier) String() string {
	switch t {
	case GPU:
		return "gpu"
	case Host:
		return "host"
	case NVMe:
		return "nvme"
	case Remote:
		return "remote"
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// Key identifies a block: the chained hash of its prefix that Hasher
// computes (h_i = XXH3-64(h_{i-1} ‖ XXH3-64(tokens of block i, seed salt)),
// internal/blockkey), or a key the caller computed elsewhere (trace hash ids).
type Key uint64

// Salt separates tenants, models and adapters: no hit crosses salts.
type Salt uint64

// Slot is a block's fixed-size place in one tier: slot s of a tier with
// SlotBytes b starts at byte s*b of that tier's memory (or file).
type Slot uint32

// BlockRef is a block's index in the manager's record slab. It is stable while
// the block is resident in, or being written to, any tier, and is the key the
// per-tier policies see. A BlockRef is reused once its block leaves every tier:
// hold a reference (a Lease) to keep it meaningful.
type BlockRef uint32
