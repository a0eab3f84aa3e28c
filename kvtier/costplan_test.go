package kvtier

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"kvtier.dev/kvtier/cost"
)

func newCostPlanner(t testing.TB, hostLink string, maxBlocks int) *cost.Planner {
	t.Helper()
	cfg, err := cost.NewPlannerConfig(cost.Presets{Model: "llama-3.1-8b", GPU: "h200", HostLink: hostLink, NVMe: "nvme-gen5", BlockTokens: 16, MaxBlocks: maxBlocks})
	if err != nil {
		t.Fatal(err)
	}
	p, err := cost.NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCostPlannerMapsActions plans random prefixes whose blocks are in the
// GPU, host, NVMe or nowhere, and checks that every action is the one
// kvtier/cost gives for the same blocks (asked directly, with its own types).
func TestCostPlannerMapsActions(t *testing.T) {
	const maxBlocks = 64
	cp, err := NewCostPlanner(newCostPlanner(t, "pcie5-pinned", maxBlocks))
	if err != nil {
		t.Fatal(err)
	}
	ref := newCostPlanner(t, "pcie5-pinned", maxBlocks)
	rng := rand.New(rand.NewPCG(5, 5))
	seen := map[Action]int{}
	for round := range 300 {
		n := 1 + rng.IntN(maxBlocks)
		blocks := make([]PlanBlock, n)
		src := make([]cost.BlockSource, n)
		for i := range blocks {
			switch rng.IntN(4) {
			case 0:
				blocks[i], src[i] = PlanBlock{Cached: true, Tier: GPU}, cost.BlockSource{Tier: cost.TierGPU}
			case 1:
				blocks[i], src[i] = PlanBlock{Cached: true, Tier: Host}, cost.BlockSource{Tier: cost.TierHost}
			case 2:
				blocks[i], src[i] = PlanBlock{Cached: true, Tier: NVMe}, cost.BlockSource{Tier: cost.TierNVMe}
			default:
				blocks[i], src[i] = PlanBlock{}, cost.BlockSource{Tier: cost.TierMissing}
			}
		}
		got := make([]Action, n)
		if err := cp.Plan(blocks, got); err != nil {
			t.Fatal(err)
		}
		want := make([]cost.Action, n)
		res, err := ref.Plan(src, want)
		if err != nil {
			t.Fatal(err)
		}
		if cp.Last() != res {
			t.Fatalf("round %d: Last() = %+v, cost says %+v", round, cp.Last(), res)
		}
		for i := range got {
			w := map[cost.Action]Action{cost.ActionNone: Use, cost.ActionLoad: Load, cost.ActionRecompute: Recompute}[want[i]]
			if got[i] != w {
				t.Fatalf("round %d block %d (%+v): action %v, cost says %v", round, i, blocks[i], got[i], want[i])
			}
			if !blocks[i].Cached && got[i] != Recompute {
				t.Fatalf("round %d block %d: missing block gets %v", round, i, got[i])
			}
			seen[got[i]]++
		}
	}
	for _, a := range []Action{Use, Load, Recompute} {
		if seen[a] == 0 {
			t.Errorf("no block got %v in 300 plans: the test does not cover it", a)
		}
	}
}

// TestCostPlannerSlowLink: over a link whose every transfer waits 5 ms,
// recomputing a short prefix is sooner than loading it, and loading most of
// a long one is sooner than recomputing it (recompute grows with the
// context).
func TestCostPlannerSlowLink(t *testing.T) {
	cfg, err := cost.NewPlannerConfig(cost.Presets{Model: "llama-3.1-8b", GPU: "h200", HostLink: "pcie5-pinned", BlockTokens: 16, MaxBlocks: 2048})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Paths[cost.TierHost] = cost.DirectPath(cost.Link{Name: "slow", BandwidthBytesPerS: 20e9, Latency: 5 * time.Millisecond})
	p, err := cost.NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := NewCostPlanner(p)
	if err != nil {
		t.Fatal(err)
	}
	// count plans n host blocks; it also checks that the recomputed blocks
	// come first (one tier: the best plan is a single cut).
	count := func(n int) (load, recompute int) {
		blocks := make([]PlanBlock, n)
		for i := range blocks {
			blocks[i] = PlanBlock{Cached: true, Tier: Host}
		}
		acts := make([]Action, n)
		if err := cp.Plan(blocks, acts); err != nil {
			t.Fatal(err)
		}
		for i, a := range acts {
			switch a {
			case Load:
				load++
			case Recompute:
				recompute++
				if load > 0 {
					t.Errorf("%d blocks: block %d recomputed after a load", n, i)
				}
			}
		}
		return load, recompute
	}
	if load, rec := count(2); load != 0 || rec != 2 {
		t.Errorf("2-block prefix over a 5 ms link: %d loads, %d recomputes; want all recomputed", load, rec)
	}
	// The long prefix recomputes its cheap early blocks while the rest
	// load, in parallel: most of it loads.
	if load, rec := count(2048); load < 2048*3/4 {
		t.Errorf("2048-block prefix: %d loads, %d recomputes; want at least 3/4 loaded", load, rec)
	}
}

func TestCostPlannerErrors(t *testing.T) {
	if _, err := NewCostPlanner(nil); !errors.Is(err, ErrConfig) {
		t.Errorf("NewCostPlanner(nil) = %v, want ErrConfig", err)
	}
	cp, err := NewCostPlanner(newCostPlanner(t, "pcie5-pinned", 4))
	if err != nil {
		t.Fatal(err)
	}
	acts := []Action{Use, Use, Use, Use, Use}
	blocks := make([]PlanBlock, 5)
	if err := cp.Plan(blocks, acts); err != nil {
		t.Errorf("a plan longer than MaxBlocks: %v", err)
	}
	for i, a := range acts {
		if a != Recompute {
			t.Errorf("uncached block %d: %v, want recompute", i, a)
		}
		acts[i] = Use
	}
	if err := cp.Plan(blocks[:2], acts[:3]); !errors.Is(err, ErrBadInput) {
		t.Errorf("mismatched lengths: %v, want ErrBadInput", err)
	}
	if err := cp.Plan([]PlanBlock{{Cached: true, Tier: NumTiers}}, acts[:1]); !errors.Is(err, ErrBadInput) {
		t.Errorf("unknown tier: %v, want ErrBadInput", err)
	}
}

// TestCostPlannerInManager runs a Manager with the cost planner: the plan
// of a host-cached prefix loads it, also for a request longer than the
// planner's MaxBlocks.
func TestCostPlannerInManager(t *testing.T) {
	p := newCostPlanner(t, "pcie5-pinned", 8)
	cp, err := NewCostPlanner(p)
	if err != nil {
		t.Fatal(err)
	}
	m := mustNew(t, Config{BlockTokens: 16, Tiers: [NumTiers]TierConfig{Host: tierCfg(t, 32)}, Planner: cp, RecomputeSeconds: RecomputeSecondsFunc(p)})
	tokens := make([]int32, 16*6)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	var w Lease
	if err := m.Insert(1, tokens, Host, &w); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(&w, nil); err != nil {
		t.Fatal(err)
	}
	m.Release(&w)
	var l Lease
	if err := m.Lookup(1, tokens, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Plan(&l); err != nil {
		t.Fatal(err)
	}
	for i, b := range l.Blocks {
		if b.Action != Load {
			t.Errorf("block %d of a host prefix over PCIe 5: %v, want load", i, b.Action)
		}
	}
	m.Release(&l)
	long := make([]int32, 16*9)
	if err := m.Lookup(1, long, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Plan(&l); err != nil {
		t.Errorf("a 9-block request with MaxBlocks 8: %v", err)
	}
	m.Release(&l)
}

func TestRecomputeCostFunc(t *testing.T) {
	p := newCostPlanner(t, "pcie5-pinned", 16)
	f := RecomputeSecondsFunc(p)
	if got, want := f(3), p.BlockRecomputeCost(3).Seconds(); got != want || got <= 0 {
		t.Errorf("f(3) = %g, want %g (> 0)", got, want)
	}
	if f(15) <= f(0) {
		t.Errorf("deep block costs %g, first %g: want deeper dearer", f(15), f(0))
	}
	// Past MaxBlocks the cost goes on growing (attention to a longer
	// context); a negative position is the first.
	if f(1000) <= f(15) || f(-1) != f(0) {
		t.Errorf("positions out of MaxBlocks: f(1000) = %g, f(15) = %g, f(-1) = %g", f(1000), f(15), f(-1))
	}
}

func TestCostPlannerAllocs(t *testing.T) {
	cp, err := NewCostPlanner(newCostPlanner(t, "pcie5-pinned", 128))
	if err != nil {
		t.Fatal(err)
	}
	blocks := make([]PlanBlock, 128)
	for i := range blocks {
		blocks[i] = PlanBlock{Cached: i < 100, Tier: Tier(i % 3)}
	}
	acts := make([]Action, len(blocks))
	if err := cp.Plan(blocks, acts); err != nil { // warm up
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := cp.Plan(blocks, acts); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Plan allocates %v times per call, want 0", n)
	}
}
