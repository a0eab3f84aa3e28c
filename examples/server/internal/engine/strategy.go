package engine

import (
	"fmt"
	"strings"

	"kvtier.dev/kvtier"
)

// Strategy is how the server uses its KV cache, so that one server binary
// is also its own baseline.
type Strategy uint8

const (
	// Cost: host and NVMe tiers; the cost model decides, block by block,
	// whether to load a cached block or recompute it.
	Cost Strategy = iota
	// Reload: host and NVMe tiers; every cached block is loaded.
	Reload
	// Recompute: host and NVMe tiers are filled, but only blocks already
	// in the GPU are used; the rest is recomputed.
	Recompute
	// GPUOnly: prefix caching in GPU memory alone (the host tier is one
	// slot, the copy engine's minimum, and never read; no NVMe).
	GPUOnly
	// None: no prefix cache: every request computes its whole prompt.
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

// ParseStrategy reads a strategy's name.
func ParseStrategy(name string) (Strategy, error) {
	for s, n := range strategyNames {
		if strings.EqualFold(name, n) {
			return Strategy(s), nil
		}
	}
	return 0, fmt.Errorf("unknown strategy %q: want one of %s", name, strings.Join(strategyNames[:], ", "))
}

// LowerTiers reports whether the strategy keeps blocks in the host and
// NVMe tiers.
func (s Strategy) LowerTiers() bool { return s <= Recompute }

// GPUHitsOnly is the planner of Recompute and GPUOnly: use what the GPU
// holds, recompute everything else.
type GPUHitsOnly struct{}

// Plan implements kvtier.Planner.
func (GPUHitsOnly) Plan(blocks []kvtier.PlanBlock, actions []kvtier.Action) error {
	for i, b := range blocks {
		if b.Cached && b.Tier == kvtier.GPU {
			actions[i] = kvtier.Use
		} else {
			actions[i] = kvtier.Recompute
		}
	}
	return nil
}
