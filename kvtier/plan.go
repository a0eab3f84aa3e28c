package kvtier

import "time"

// Action is what to do with one looked-up block.
type Action uint8

const (
	Use       Action = iota // the block is ready in the GPU tier
	Load                    // copy it from its tier into the GPU (Onboard)
	Recompute               // prefill it again instead of loading it
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
	Planned    Reason = iota // not a load turned into a recompute
	NoGPUSlot                // every GPU slot in use or still being demoted
	GPUBusy                  // the block is being written into or evicted from the GPU
	SourceLost               // its copy in the source tier was lost since the lookup
	NumReasons               // counts the reasons; not one
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
	Cached bool // a tier holds the block ready; if not, it MUST be recomputed
	Tier   Tier // the fastest tier holding it (when Cached)
}

// PlanRequest is what a Planner knows of one request.
type PlanRequest struct {
	// Blocks is the whole request in token order, block i covering tokens
	// [i*BlockTokens, (i+1)*BlockTokens): the cached prefix, then the
	// blocks to compute (and, with Config.MaxHoleBlocks, cached blocks
	// after holes).
	Blocks     []PlanBlock
	LastTokens int     // the last block's tokens when partial, else 0
	Backlog    Backlog // the Mover's (Backlogger), else zero
}

// Backlog is the work already queued where a request's own work will run:
// how long each resource stays busy before it can start on this request.
type Backlog struct {
	Ingress time.Duration // the GPU's ingress: loads from the host tier and NVMe
	Drive   time.Duration // the NVMe drive: its queued reads and writes
	GPU     time.Duration // the GPU's compute before this request's prefill
}

// Backlogger is implemented by a Mover that knows its queues: Plan asks it,
// without the manager's lock, so Backlog MUST be safe for concurrent use
// and cheap.
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
