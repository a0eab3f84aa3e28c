package costplan

import (
	"fmt"
	"sync"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
)

// Planner is a kvtier.Planner that asks kvtier/cost, block by block,
// whether loading a cached block or recomputing it brings the whole
// prompt onto the GPU sooner, behind the request's backlog.
type Planner struct {
	mu      sync.Mutex
	p       *cost.Planner
	sources []cost.BlockSource // scratch, guarded by mu
	actions []cost.Action      // scratch, guarded by mu
}

// New wraps p. The Planner OWNS p from now on: the caller MUST NOT call
// p.Plan itself (it is not safe for concurrent use). Requests of any length
// are planned (p's MaxBlocks only sizes scratch space up front).
func New(p *cost.Planner) (*Planner, error) {
	if p == nil {
		return nil, fmt.Errorf("%w: costplan.New: nil *cost.Planner", kvtier.ErrConfig)
	}
	n := p.Config().MaxBlocks
	return &Planner{p: p, sources: make([]cost.BlockSource, 0, n), actions: make([]cost.Action, n)}, nil
}

var costTier = [kvtier.NumTiers]cost.Tier{kvtier.GPU: cost.TierGPU, kvtier.Host: cost.TierHost, kvtier.NVMe: cost.TierNVMe}

// Plan implements kvtier.Planner.
func (c *Planner) Plan(req *kvtier.PlanRequest, actions []kvtier.Action) (kvtier.Estimate, error) {
	blocks := req.Blocks
	if len(actions) != len(blocks) {
		return kvtier.Estimate{}, fmt.Errorf("%w: costplan.Planner.Plan: %d actions for %d blocks", kvtier.ErrBadInput, len(actions), len(blocks))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources = c.sources[:0]
	for i, b := range blocks {
		t := cost.TierMissing
		if b.Cached {
			if b.Tier >= kvtier.NumTiers {
				return kvtier.Estimate{}, fmt.Errorf("%w: costplan.Planner.Plan: block %d is cached in %v", kvtier.ErrBadInput, i, b.Tier)
			}
			t = costTier[b.Tier]
		}
		c.sources = append(c.sources, cost.BlockSource{Tier: t})
	}
	if n := len(c.sources); n > 0 && req.LastTokens > 0 && req.LastTokens < c.p.Config().BlockTokens {
		c.sources[n-1].Tokens = req.LastTokens
	}
	if len(c.actions) < len(blocks) {
		c.actions = make([]cost.Action, len(blocks))
	}
	res, err := c.p.PlanQueued(c.sources, c.actions[:len(blocks)], cost.Backlog{Link: req.Backlog.Ingress, GPU: req.Backlog.GPU, Drive: req.Backlog.Drive})
	if err != nil {
		return kvtier.Estimate{}, err
	}
	for i, a := range c.actions[:len(blocks)] {
		switch a {
		case cost.ActionNone:
			actions[i] = kvtier.Use
		case cost.ActionLoad:
			actions[i] = kvtier.Load
		default:
			actions[i] = kvtier.Recompute
		}
	}
	return kvtier.Estimate{Time: res.Time, LoadAllTime: res.LoadAllTime, RecomputeAllTime: res.RecomputeAllTime}, nil
}

// RecomputeSeconds returns a kvtier.Config.RecomputeSeconds built from p:
// the prefill seconds of the block at position when the blocks before it
// are present. p's costs are read atomically (BlockRecomputeCost), so the
// function is safe for concurrent use even while a Planner plans with p.
func RecomputeSeconds(p *cost.Planner) func(position int) float64 {
	return func(position int) float64 {
		return p.BlockRecomputeCost(max(position, 0)).Seconds()
	}
}
