package costplan

import (
	"fmt"
	"strings"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
)

// Strategy is how a server (or a replay of one) uses its KV cache, so that
// one server is also its own baseline.
type Strategy uint8

const (
	// Cost keeps host and NVMe tiers and plans each request block by block
	// with kvtier/cost: load a cached block or recompute it, whichever gets
	// the whole prompt onto the GPU sooner.
	Cost Strategy = iota
	// Reload keeps host and NVMe tiers and loads every cached block
	// (kvtier.LoadAll).
	Reload
	// Recompute fills the host and NVMe tiers but uses only the blocks
	// already in the GPU and recomputes every other one (kvtier.RecomputeAll).
	Recompute
	// GPUOnly is a prefix cache in GPU memory alone: no host or NVMe tier.
	GPUOnly
	// None is no prefix cache: every request prefills its whole prompt.
	None
	// NumStrategies counts the strategies; it is not one.
	NumStrategies
)

var strategyNames = [NumStrategies]string{"cost", "reload", "recompute", "gpu-only", "none"}

// String names the strategy as ParseStrategy reads it.
func (s Strategy) String() string {
	if s < NumStrategies {
		return strategyNames[s]
	}
	return fmt.Sprintf("strategy(%d)", uint8(s))
}

// Describe says what the strategy does, for reports.
func (s Strategy) Describe() string {
	switch s {
	case Cost:
		return "cost-model plan: load or recompute per block"
	case Reload:
		return "always reload cached blocks"
	case Recompute:
		return "always recompute what is not on the GPU"
	case GPUOnly:
		return "prefix cache in GPU memory only"
	case None:
		return "no prefix cache"
	}
	return s.String()
}

// ParseStrategy reads a strategy's name (any case).
func ParseStrategy(name string) (Strategy, error) {
	for s, n := range strategyNames {
		if strings.EqualFold(name, n) {
			return Strategy(s), nil
		}
	}
	return 0, fmt.Errorf("unknown strategy %q: want one of %s", name, strings.Join(strategyNames[:], ", "))
}

// Caches reports whether the strategy keeps a prefix cache at all.
func (s Strategy) Caches() bool { return s < None }

// LowerTiers reports whether the strategy keeps blocks in the host and
// NVMe tiers.
func (s Strategy) LowerTiers() bool { return s <= Recompute }

// Planner returns the strategy's planner: a Planner over p for Cost,
// kvtier.LoadAll for Reload, kvtier.RecomputeAll for Recompute and
// GPUOnly, and nil for None (there is nothing to plan). p is needed for
// Cost only; the returned Planner OWNS it.
func (s Strategy) Planner(p *cost.Planner) (kvtier.Planner, error) {
	switch s {
	case Cost:
		return New(p)
	case Reload:
		return kvtier.LoadAll{}, nil
	case Recompute, GPUOnly:
		return kvtier.RecomputeAll{}, nil
	case None:
		return nil, nil
	}
	return nil, fmt.Errorf("%w: costplan: %v", kvtier.ErrBadInput, s)
}
