package kvtier

// Action is what to do with one looked-up block.
type Action uint8

const (
	// Use means the block is already ready in the GPU tier.
	Use Action = iota
	// Load means copy the block from its tier into the GPU (Onboard).
	Load
	// Recompute means prefill the block again instead of loading it.
	Recompute
)

// String names the action.
func (a Action) String() string {
	switch a {
	case Use:
		return "use"
	case Load:
		return "load"
	case Recompute:
		return "recompute"
	}
	return "action(?)"
}

// Reason says why Onboard recomputes a block that the plan said to load.
type Reason uint8

const (
	// Planned: the block is not a load turned into a recompute.
	Planned Reason = iota
	// NoGPUSlot: every GPU slot is in use or still being demoted (in
	// write-back mode, the demotions Onboard started free slots for a
	// retry).
	NoGPUSlot
	// GPUBusy: the block itself is being written into or evicted from the
	// GPU by another request or copy.
	GPUBusy
	// SourceLost: its copy in the tier it would load from was lost (a
	// failed or corrupt NVMe read) since the lookup.
	SourceLost
	// NumReasons counts the reasons; it is not one.
	NumReasons
)

// String names the reason, as in metrics.
func (r Reason) String() string {
	switch r {
	case Planned:
		return "planned"
	case NoGPUSlot:
		return "no_gpu_slot"
	case GPUBusy:
		return "gpu_busy"
	case SourceLost:
		return "source_lost"
	}
	return "reason(?)"
}

// PlanBlock is what a Planner knows about one block of a request.
type PlanBlock struct {
	// Cached reports whether a tier holds the block ready; if not, the
	// block MUST be recomputed.
	Cached bool
	// Tier is the fastest tier holding a ready copy (when Cached).
	Tier Tier
}

// Planner decides, block by block, whether to load a cached block or
// recompute it; kvtier/cost's Planner does it from the model, GPU and link
// rates (its BlockSource tiers and Actions map one to one onto these, in the
// same order).
type Planner interface {
	// Plan sets actions[i] for blocks[i], len(actions) == len(blocks).
	// blocks is the whole request in token order: block i covers tokens
	// [i*BlockTokens, (i+1)*BlockTokens); the cached prefix comes first, the
	// blocks to compute after it, except that with Config.MaxHoleBlocks
	// cached blocks may follow missing ones (holes, to recompute). Plan MUST NOT keep either slice; it is
	// called without the manager's lock, possibly from many goroutines at
	// once.
	Plan(blocks []PlanBlock, actions []Action) error
}

// LoadAll is the default Planner: use what is in the GPU, load every other
// cached block, recompute the rest.
type LoadAll struct{}

// Plan implements Planner.
func (LoadAll) Plan(blocks []PlanBlock, actions []Action) error {
	for i, b := range blocks {
		switch {
		case !b.Cached:
			actions[i] = Recompute
		case b.Tier == GPU:
			actions[i] = Use
		default:
			actions[i] = Load
		}
	}
	return nil
}
