package kvtier

import (
	"fmt"
	"sync"

	"kvtier.dev/kvtier/cost"
)

// CostPlanner is a Planner that asks kvtier/cost, block by block, whether
// loading a cached block or recomputing it brings the whole prefix onto the
// GPU sooner. Tiers and actions map one to one: GPU, Host and NVMe to
// cost.TierGPU, TierHost and TierNVMe, a block no tier holds to
// cost.TierMissing; cost's ActionNone, ActionLoad and ActionRecompute back to
// Use, Load and Recompute.
//
// A cost.Planner is not safe for concurrent use, so CostPlanner locks around
// it: plans take a few microseconds for a few hundred blocks, far less than
// the copies they decide. Plan allocates nothing once its scratch has grown
// to the longest request seen.
type CostPlanner struct {
	mu      sync.Mutex
	p       *cost.Planner
	sources []cost.BlockSource // scratch, guarded by mu
	actions []cost.Action      // scratch, guarded by mu
	last    cost.PlanResult    // guarded by mu
}

// NewCostPlanner wraps p. The CostPlanner OWNS p from now on: the caller
// MUST NOT call p.Plan itself (it is not safe for concurrent use).
// Requests of any length are planned (p's MaxBlocks only sizes scratch
// space up front).
func NewCostPlanner(p *cost.Planner) (*CostPlanner, error) {
	if p == nil {
		return nil, fmt.Errorf("%w: NewCostPlanner: nil *cost.Planner", ErrConfig)
	}
	n := p.Config().MaxBlocks
	return &CostPlanner{
		p:       p,
		sources: make([]cost.BlockSource, 0, n),
		actions: make([]cost.Action, n),
	}, nil
}

// Plan implements Planner.
func (c *CostPlanner) Plan(blocks []PlanBlock, actions []Action) error {
	if len(actions) != len(blocks) {
		return fmt.Errorf("%w: CostPlanner.Plan: %d actions for %d blocks", ErrBadInput, len(actions), len(blocks))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources = c.sources[:0]
	for i, b := range blocks {
		t := cost.TierMissing
		if b.Cached {
			switch b.Tier {
			case GPU:
				t = cost.TierGPU
			case Host:
				t = cost.TierHost
			case NVMe:
				t = cost.TierNVMe
			default:
				return fmt.Errorf("%w: CostPlanner.Plan: block %d is cached in %v", ErrBadInput, i, b.Tier)
			}
		}
		c.sources = append(c.sources, cost.BlockSource{Tier: t})
	}
	if len(c.actions) < len(blocks) {
		c.actions = make([]cost.Action, len(blocks))
	}
	res, err := c.p.Plan(c.sources, c.actions)
	if err != nil {
		return err
	}
	c.last = res
	for i, a := range c.actions[:len(blocks)] {
		switch a {
		case cost.ActionNone:
			actions[i] = Use
		case cost.ActionLoad:
			actions[i] = Load
		default:
			actions[i] = Recompute
		}
	}
	return nil
}

// Last is the summary of the most recent successful plan (its modelled
// time, and what loading or recomputing everything would have taken). With
// many goroutines planning at once it is any one of theirs.
func (c *CostPlanner) Last() cost.PlanResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// RecomputeSecondsFunc returns a Config.RecomputeSeconds built from p: the prefill
// seconds of the block at position when the blocks before it are present.
// p's costs are read atomically (BlockRecomputeCost), so the function is
// safe for concurrent use even while a CostPlanner plans with p.
func RecomputeSecondsFunc(p *cost.Planner) func(position int) float64 {
	return func(position int) float64 {
		return p.BlockRecomputeCost(max(position, 0)).Seconds()
	}
}
