package replay

import (
	"fmt"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
)

// Strategy is how a replay treats cached blocks.
type Strategy uint8

const (
	// StrategyCost plans each request block by block with kvtier/cost:
	// load a cached block or recompute it, whichever gets the whole prompt
	// onto the GPU sooner (recompute the first blocks while the rest load),
	// and the replay executes that plan as the cost model times it. Each
	// prefilling request has its GPU to itself (Config.PrefillSlots).
	StrategyCost Strategy = iota
	// StrategyReload loads every cached block (kvtier.LoadAll).
	StrategyReload
	// StrategyRecompute uses blocks already on the GPU and recomputes every
	// other one; the lower tiers are kept but never read.
	StrategyRecompute
	// StrategyGPUOnly is a prefix cache in GPU memory alone: no host or NVMe
	// tier.
	StrategyGPUOnly
	// StrategyNone is no prefix cache: every request prefills its whole
	// prompt.
	StrategyNone
	NumStrategies
)

var strategyNames = [NumStrategies]string{"cost", "reload", "recompute", "gpu-only", "none"}

func (s Strategy) String() string {
	if s < NumStrategies {
		return strategyNames[s]
	}
	return fmt.Sprintf("Strategy(%d)", uint8(s))
}

// Describe says what the strategy does, for the report.
func (s Strategy) Describe() string {
	switch s {
	case StrategyCost:
		return "cost-model plan: load or recompute per block"
	case StrategyReload:
		return "always reload cached blocks"
	case StrategyRecompute:
		return "always recompute what is not on the GPU"
	case StrategyGPUOnly:
		return "prefix cache in GPU memory only"
	case StrategyNone:
		return "no prefix cache"
	}
	return s.String()
}

// ParseStrategy returns the strategy named s.
func ParseStrategy(s string) (Strategy, error) {
	for st := range NumStrategies {
		if strategyNames[st] == s {
			return st, nil
		}
	}
	return 0, fmt.Errorf("unknown strategy %q (known: cost, reload, recompute, gpu-only, none)", s)
}

// costPlanner adapts kvtier/cost's Planner to the block manager's Planner
// interface, and keeps the cost model's estimate of the last plan for the
// report. It is not safe for concurrent use, as the block manager allows:
// the engine is single-threaded.
type costPlanner struct {
	p    *cost.Planner
	src  []cost.BlockSource
	out  []cost.Action
	last cost.PlanResult
	// blocks and lastTokens, set by the engine before each plan, are the
	// request's blocks and the tokens of its last one: the blocks past the
	// looked-up prefix are planned as missing, so that the plan (and its
	// time) covers the whole prompt, the partial last block included.
	blocks, lastTokens int
	// backlog, set by the engine before each plan, is the work queued
	// ahead of the request: the copies on the GPU's ingress. Its GPU
	// backlog is always 0: a prefilling request has its GPU's compute to
	// itself (Config.PrefillSlots).
	backlog cost.Backlog
}

var toCostTier = [kvtier.NumTiers]cost.Tier{kvtier.GPU: cost.TierGPU, kvtier.Host: cost.TierHost, kvtier.NVMe: cost.TierNVMe}

// Plan implements kvtier.Planner. It plans requests of any length.
func (c *costPlanner) Plan(blocks []kvtier.PlanBlock, actions []kvtier.Action) error {
	c.last = cost.PlanResult{}
	c.src = c.src[:0]
	for _, b := range blocks {
		t := cost.TierMissing
		if b.Cached {
			t = toCostTier[b.Tier]
		}
		c.src = append(c.src, cost.BlockSource{Tier: t})
	}
	for len(c.src) < c.blocks {
		c.src = append(c.src, cost.BlockSource{Tier: cost.TierMissing})
	}
	if n := len(c.src); n > 0 && n == c.blocks && c.lastTokens > 0 && c.lastTokens < c.p.Config().BlockTokens {
		c.src[n-1].Tokens = c.lastTokens
	}
	if cap(c.out) < len(c.src) {
		c.out = make([]cost.Action, len(c.src))
	}
	res, err := c.p.PlanQueued(c.src, c.out[:len(c.src)], c.backlog)
	if err != nil {
		return err
	}
	c.last = res
	for i := range blocks {
		switch c.out[i] {
		case cost.ActionNone:
			actions[i] = kvtier.Use
		case cost.ActionLoad:
			actions[i] = kvtier.Load
		default:
			actions[i] = kvtier.Recompute
		}
	}
	return nil
}

// recomputeAll is the always-recompute Planner: use what is on the GPU,
// recompute the rest.
type recomputeAll struct{}

// Plan implements kvtier.Planner.
func (recomputeAll) Plan(blocks []kvtier.PlanBlock, actions []kvtier.Action) error {
	for i, b := range blocks {
		if b.Cached && b.Tier == kvtier.GPU {
			actions[i] = kvtier.Use
		} else {
			actions[i] = kvtier.Recompute
		}
	}
	return nil
}
