package costplan

import (
	"errors"
	"strings"
	"testing"

	"kvtier.dev/kvtier"
)

func TestParseStrategy(t *testing.T) {
	for s := range NumStrategies {
		got, err := ParseStrategy(strings.ToUpper(s.String()))
		if err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %v, %v", strings.ToUpper(s.String()), got, err)
		}
		if s.Describe() == s.String() {
			t.Errorf("%v has no description", s)
		}
	}
	_, err := ParseStrategy("lru")
	if err == nil || !strings.Contains(err.Error(), `"lru"`) || !strings.Contains(err.Error(), "gpu-only") {
		t.Errorf("unknown strategy: %v, want an error naming it and the known ones", err)
	}
	if Cost.LowerTiers() != true || GPUOnly.LowerTiers() || !GPUOnly.Caches() || None.Caches() {
		t.Error("LowerTiers or Caches")
	}
}

// TestStrategyPlanners: each strategy's planner on one request: a GPU
// block, 40 on NVMe and 2 to compute. Cost splits the NVMe prefix (its
// first blocks recomputed while the rest load), Reload loads it, Recompute
// and GPUOnly recompute it, None has no planner.
func TestStrategyPlanners(t *testing.T) {
	blocks := []kvtier.PlanBlock{{Cached: true, Tier: kvtier.GPU}}
	for range 40 {
		blocks = append(blocks, kvtier.PlanBlock{Cached: true, Tier: kvtier.NVMe})
	}
	blocks = append(blocks, kvtier.PlanBlock{}, kvtier.PlanBlock{})
	req := &kvtier.PlanRequest{Blocks: blocks}
	count := func(actions []kvtier.Action) (use, load, rec int) {
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
	for s := range NumStrategies {
		p, err := s.Planner(newCostModel(t, "pcie5-pinned", 64))
		if s == None {
			if p != nil || err != nil {
				t.Errorf("none: planner %v, %v", p, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		actions := make([]kvtier.Action, len(blocks))
		est, err := p.Plan(req, actions)
		if err != nil {
			t.Fatal(err)
		}
		use, load, rec := count(actions)
		switch s {
		case Cost:
			if use != 1 || rec <= 2 || load == 0 || actions[1] != kvtier.Recompute || actions[len(actions)-1] != kvtier.Recompute {
				t.Errorf("cost: %d used, %d loaded, %d recomputed (%v); want a split", use, load, rec, actions)
			}
			if !(est.Time < est.LoadAllTime && est.LoadAllTime < est.RecomputeAllTime) {
				t.Errorf("cost: %+v", est)
			}
		case Reload:
			if use != 1 || load != 40 || rec != 2 {
				t.Errorf("reload: %d used, %d loaded, %d recomputed", use, load, rec)
			}
		case Recompute, GPUOnly:
			if use != 1 || load != 0 || rec != 42 {
				t.Errorf("%v: %d used, %d loaded, %d recomputed", s, use, load, rec)
			}
		}
	}
	if _, err := NumStrategies.Planner(nil); !errors.Is(err, kvtier.ErrBadInput) {
		t.Errorf("an unknown strategy's planner: %v", err)
	}
}

// TestPlannerBeyondScratch: a request longer than the cost model's scratch
// space, and a partial last block, are planned all the same.
func TestPlannerBeyondScratch(t *testing.T) {
	p, err := New(newCostModel(t, "pcie5-pinned", 8))
	if err != nil {
		t.Fatal(err)
	}
	long := make([]kvtier.PlanBlock, 100)
	actions := make([]kvtier.Action, len(long))
	short, err := p.Plan(&kvtier.PlanRequest{Blocks: long}, actions)
	if err != nil {
		t.Fatalf("a plan beyond the scratch space: %v", err)
	}
	for i, a := range actions {
		if a != kvtier.Recompute {
			t.Fatalf("block %d of an uncached long request: %v, want recompute", i, a)
		}
	}
	partial, err := p.Plan(&kvtier.PlanRequest{Blocks: long, LastTokens: 3}, actions)
	if err != nil {
		t.Fatal(err)
	}
	if partial.Time >= short.Time {
		t.Errorf("a last block of 3 tokens: %v, of 16: %v; want less", partial.Time, short.Time)
	}
}
