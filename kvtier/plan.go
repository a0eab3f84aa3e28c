package kvtier

import "time"

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

// PlanRequest is what a Planner knows of one request.
type PlanRequest struct {
	// Blocks is the whole request in token order: block i covers tokens
	// [i*BlockTokens, (i+1)*BlockTokens). The cached prefix comes first,
	// the blocks to compute after it, except that with
	// Config.MaxHoleBlocks cached blocks may follow missing ones (holes,
	// to recompute).
	Blocks []PlanBlock
	// LastTokens is the last block's tokens when it is partial (fewer than
	// BlockTokens), 0 when it is full.
	LastTokens int
	// Backlog is the work queued ahead of this request's, as the Mover
	// reports it (Backlogger); zero when it does not.
	Backlog Backlog
}

// Backlog is the work already queued where a request's own work will run:
// how long each resource stays busy before it can start on this request.
type Backlog struct {
	// Ingress: the copies queued on the GPU's ingress (its loads from the
	// host tier and from NVMe).
	Ingress time.Duration
	// Drive: the NVMe reads and writes queued on the drive.
	Drive time.Duration
	// GPU: the compute queued on the GPU before this request's prefill.
	GPU time.Duration
}

// Backlogger is implemented by a Mover that knows its queues. The manager
// asks it for the backlog of every request it plans, without its lock
// held; Backlog MUST be safe for concurrent use and cheap (a few atomic
// loads).
type Backlogger interface {
	Backlog() Backlog
}

// Estimate is a Planner's prediction of a request's prefill (0 when it has
// no model): under its plan, and if everything cached were loaded or
// recomputed.
type Estimate struct {
	Time, LoadAllTime, RecomputeAllTime time.Duration
}

// Planner decides, block by block, whether to load a cached block or
// recompute it; kvtier/costplan's Planner does it from kvtier/cost's model
// of the GPU, the links and their backlogs.
type Planner interface {
	// Plan sets actions[i] for req.Blocks[i], len(actions) ==
	// len(req.Blocks), and returns its estimate. Plan MUST NOT keep req or
	// actions; it is called without the manager's lock, possibly from many
	// goroutines at once.
	Plan(req *PlanRequest, actions []Action) (Estimate, error)
}

// LoadAll is the default Planner: use what is in the GPU, load every other
// cached block, recompute the rest.
type LoadAll struct{}

// Plan implements Planner.
func (LoadAll) Plan(req *PlanRequest, actions []Action) (Estimate, error) {
	for i, b := range req.Blocks {
		switch {
		case !b.Cached:
			actions[i] = Recompute
		case b.Tier == GPU:
			actions[i] = Use
		default:
			actions[i] = Load
		}
	}
	return Estimate{}, nil
}

// RecomputeAll is the Planner of a prefix cache in GPU memory alone: use
// what the GPU holds, recompute everything else.
type RecomputeAll struct{}

// Plan implements Planner.
func (RecomputeAll) Plan(req *PlanRequest, actions []Action) (Estimate, error) {
	for i, b := range req.Blocks {
		if b.Cached && b.Tier == GPU {
			actions[i] = Use
		} else {
			actions[i] = Recompute
		}
	}
	return Estimate{}, nil
}
