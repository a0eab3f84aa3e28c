package replay

import (
	"testing"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
)

func newTestCostPlanner(t *testing.T) *costPlanner {
	t.Helper()
	e, err := newEngine(DefaultConfig(), StrategyCost)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.start(512); err != nil {
		t.Fatal(err)
	}
	return e.planner
}

// TestCostPlannerAdapter: a prefix on NVMe is split (its first blocks
// recomputed while the rest load), unless the GPU is busy; blocks on the GPU
// are used and uncached ones recomputed either way.
func TestCostPlannerAdapter(t *testing.T) {
	p := newTestCostPlanner(t)
	blocks := []kvtier.PlanBlock{{Cached: true, Tier: kvtier.GPU}}
	for range 40 {
		blocks = append(blocks, kvtier.PlanBlock{Cached: true, Tier: kvtier.NVMe})
	}
	blocks = append(blocks, kvtier.PlanBlock{}, kvtier.PlanBlock{})
	actions := make([]kvtier.Action, len(blocks))
	count := func() (use, load, rec int) {
		for _, a := range actions {
			switch a {
			case kvtier.Use:
				use++
			case kvtier.Load:
				load++
			default:
				rec++
			}
		}
		return
	}
	if err := p.Plan(blocks, actions); err != nil {
		t.Fatal(err)
	}
	use, load, rec := count()
	if use != 1 || rec <= 2 || load == 0 || actions[1] != kvtier.Recompute || actions[len(actions)-1] != kvtier.Recompute {
		t.Errorf("idle GPU: %d used, %d loaded, %d recomputed (%v); want a split", use, load, rec, actions)
	}
	if !(p.last.Time < p.last.LoadAllTime && p.last.LoadAllTime < p.last.RecomputeAllTime) {
		t.Errorf("plan %v, load all %v, recompute all %v", p.last.Time, p.last.LoadAllTime, p.last.RecomputeAllTime)
	}
	// The request goes on past its cached prefix: the plan covers its
	// whole prompt, so its time grows by the missing blocks' prefill.
	prefixOnly := p.last.Time
	p.blocks, p.lastTokens = len(blocks)+8, 100
	if err := p.Plan(blocks, actions); err != nil {
		t.Fatal(err)
	}
	if p.last.Time <= prefixOnly || p.last.RecomputeBlocks < 8 {
		t.Errorf("with 8 missing blocks after the prefix: %+v, prefix alone %v", p.last, prefixOnly)
	}
	p.blocks, p.lastTokens = 0, 0
	// Longer than the cost model's scratch space: planned all the same
	// (nothing cached: every block recomputed).
	long := make([]kvtier.PlanBlock, planScratchBlocks+1)
	longActions := make([]kvtier.Action, len(long))
	if err := p.Plan(long, longActions); err != nil {
		t.Errorf("a plan beyond the scratch space: %v", err)
	}
	for i, a := range longActions {
		if a != kvtier.Recompute {
			t.Fatalf("block %d of an uncached long request: %v, want recompute", i, a)
		}
	}
	recomputeAll{}.Plan(blocks, actions)
	if use, load, rec := count(); use != 1 || load != 0 || rec != 42 {
		t.Errorf("recompute all: %d used, %d loaded, %d recomputed", use, load, rec)
	}
	if toCostTier[kvtier.Host] != cost.TierHost || toCostTier[kvtier.NVMe] != cost.TierNVMe {
		t.Error("tier mapping")
	}
}
