package costplan

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/policy"
)

func newCostModel(t testing.TB, hostLink string, maxBlocks int) *cost.Planner {
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
// kvtier.GPU, host, kvtier.NVMe or nowhere, and checks that every action is the one
// kvtier/cost gives for the same blocks (asked directly, with its own types).
func TestCostPlannerMapsActions(t *testing.T) {
	const maxBlocks = 64
	cp, err := New(newCostModel(t, "pcie5-pinned", maxBlocks))
	if err != nil {
		t.Fatal(err)
	}
	ref := newCostModel(t, "pcie5-pinned", maxBlocks)
	rng := rand.New(rand.NewPCG(5, 5))
	seen := map[kvtier.Action]int{}
	for round := range 300 {
		n := 1 + rng.IntN(maxBlocks)
		blocks := make([]kvtier.PlanBlock, n)
		src := make([]cost.BlockSource, n)
		for i := range blocks {
			switch rng.IntN(4) {
			case 0:
				blocks[i], src[i] = kvtier.PlanBlock{Cached: true, Tier: kvtier.GPU}, cost.BlockSource{Tier: cost.TierGPU}
			case 1:
				blocks[i], src[i] = kvtier.PlanBlock{Cached: true, Tier: kvtier.Host}, cost.BlockSource{Tier: cost.TierHost}
			case 2:
				blocks[i], src[i] = kvtier.PlanBlock{Cached: true, Tier: kvtier.NVMe}, cost.BlockSource{Tier: cost.TierNVMe}
			default:
				blocks[i], src[i] = kvtier.PlanBlock{}, cost.BlockSource{Tier: cost.TierMissing}
			}
		}
		got := make([]kvtier.Action, n)
		est, err := cp.Plan(&kvtier.PlanRequest{Blocks: blocks}, got)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]cost.Action, n)
		res, err := ref.Plan(src, want)
		if err != nil {
			t.Fatal(err)
		}
		if est != (kvtier.Estimate{Time: res.Time, LoadAllTime: res.LoadAllTime, RecomputeAllTime: res.RecomputeAllTime}) {
			t.Fatalf("round %d: estimate %+v, cost says %+v", round, est, res)
		}
		for i := range got {
			w := map[cost.Action]kvtier.Action{cost.ActionNone: kvtier.Use, cost.ActionLoad: kvtier.Load, cost.ActionRecompute: kvtier.Recompute}[want[i]]
			if got[i] != w {
				t.Fatalf("round %d block %d (%+v): action %v, cost says %v", round, i, blocks[i], got[i], want[i])
			}
			if !blocks[i].Cached && got[i] != kvtier.Recompute {
				t.Fatalf("round %d block %d: missing block gets %v", round, i, got[i])
			}
			seen[got[i]]++
		}
	}
	for _, a := range []kvtier.Action{kvtier.Use, kvtier.Load, kvtier.Recompute} {
		if seen[a] == 0 {
			t.Errorf("no block got %v in 300 plans: the test does not cover it", a)
		}
	}
}

// TestCostPlannerSlowLink: over a link whose every copy call waits 5 ms
// (a pass's loads make one per layer), recomputing a short prefix is
// sooner than loading it, and loading most of a long one is sooner than
// recomputing it (recompute grows with the context).
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
	cp, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	// count plans n host blocks; it also checks that the recomputed blocks
	// come first (one tier: the best plan is a single cut).
	count := func(n int) (load, recompute int) {
		blocks := make([]kvtier.PlanBlock, n)
		for i := range blocks {
			blocks[i] = kvtier.PlanBlock{Cached: true, Tier: kvtier.Host}
		}
		acts := make([]kvtier.Action, n)
		if _, err := cp.Plan(&kvtier.PlanRequest{Blocks: blocks}, acts); err != nil {
			t.Fatal(err)
		}
		for i, a := range acts {
			switch a {
			case kvtier.Load:
				load++
			case kvtier.Recompute:
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
	// load, layer by layer: most of it loads (1,432 of 2,048).
	if load, rec := count(2048); load < 2048*2/3 {
		t.Errorf("2048-block prefix: %d loads, %d recomputes; want at least 2/3 loaded", load, rec)
	}
}

func TestCostPlannerErrors(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, kvtier.ErrConfig) {
		t.Errorf("New(nil) = %v, want kvtier.ErrConfig", err)
	}
	cp, err := New(newCostModel(t, "pcie5-pinned", 4))
	if err != nil {
		t.Fatal(err)
	}
	acts := []kvtier.Action{kvtier.Use, kvtier.Use, kvtier.Use, kvtier.Use, kvtier.Use}
	blocks := make([]kvtier.PlanBlock, 5)
	if _, err := cp.Plan(&kvtier.PlanRequest{Blocks: blocks}, acts); err != nil {
		t.Errorf("a plan longer than MaxBlocks: %v", err)
	}
	for i, a := range acts {
		if a != kvtier.Recompute {
			t.Errorf("uncached block %d: %v, want recompute", i, a)
		}
		acts[i] = kvtier.Use
	}
	if _, err := cp.Plan(&kvtier.PlanRequest{Blocks: blocks[:2]}, acts[:3]); !errors.Is(err, kvtier.ErrBadInput) {
		t.Errorf("mismatched lengths: %v, want kvtier.ErrBadInput", err)
	}
	if _, err := cp.Plan(&kvtier.PlanRequest{Blocks: []kvtier.PlanBlock{{Cached: true, Tier: kvtier.NumTiers}}}, acts[:1]); !errors.Is(err, kvtier.ErrBadInput) {
		t.Errorf("unknown tier: %v, want kvtier.ErrBadInput", err)
	}
}

// TestCostPlannerInManager runs a Manager with the cost planner: the plan
// of a host-cached prefix of 24 blocks recomputes the head whose compute
// hides under the pass's floor and loads the rest, also for a request
// longer than the planner's MaxBlocks.
func TestCostPlannerInManager(t *testing.T) {
	p := newCostModel(t, "pcie5-pinned", 8)
	cp, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	m, err := kvtier.New(kvtier.Config{BlockTokens: 16, Tiers: [kvtier.NumTiers]kvtier.TierConfig{kvtier.Host: hostTier(t, 32)}, Planner: cp, RecomputeSeconds: RecomputeSeconds(p)})
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]int32, 16*24)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	var w kvtier.Lease
	if err := m.Insert(1, tokens, kvtier.Host, &w); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(&w, nil); err != nil {
		t.Fatal(err)
	}
	m.Release(&w)
	var l kvtier.Lease
	if err := m.Lookup(1, tokens, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Plan(&l); err != nil {
		t.Fatal(err)
	}
	loads := 0
	for i, b := range l.Blocks {
		switch {
		case b.Action == kvtier.Load:
			loads++
		case loads > 0 || b.Action != kvtier.Recompute:
			t.Errorf("block %d of a host prefix over PCIe 5: %v after %d loads, want a recomputed head, then loads", i, b.Action, loads)
		}
	}
	if loads < len(l.Blocks)/2 {
		t.Errorf("%d of %d blocks of a host prefix over PCIe 5 loaded, want most", loads, len(l.Blocks))
	}
	m.Release(&l)
	long := make([]int32, 16*25)
	if err := m.Lookup(1, long, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Plan(&l); err != nil {
		t.Errorf("a 25-block request with MaxBlocks 8: %v", err)
	}
	m.Release(&l)
}

func TestRecomputeCostFunc(t *testing.T) {
	p := newCostModel(t, "pcie5-pinned", 16)
	f := RecomputeSeconds(p)
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
	cp, err := New(newCostModel(t, "pcie5-pinned", 128))
	if err != nil {
		t.Fatal(err)
	}
	blocks := make([]kvtier.PlanBlock, 128)
	for i := range blocks {
		blocks[i] = kvtier.PlanBlock{Cached: i < 100, Tier: kvtier.Tier(i % 3)}
	}
	acts := make([]kvtier.Action, len(blocks))
	req := &kvtier.PlanRequest{Blocks: blocks}
	if _, err := cp.Plan(req, acts); err != nil { // warm up
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := cp.Plan(req, acts); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Plan allocates %v times per call, want 0", n)
	}
}

// hostTier is a host tier of n slots of 1 KiB with an LRU.
func hostTier(t *testing.T, n int) kvtier.TierConfig {
	p, err := policy.NewDenseLRU[kvtier.BlockRef](n)
	if err != nil {
		t.Fatal(err)
	}
	return kvtier.TierConfig{CapacityBytes: int64(n) << 10, SlotBytes: 1 << 10, Policy: p}
}

// TestPlannerLoadsAfterHoles: given a request with a hole (block 2, in no
// tier) between host blocks, the planner recomputes the hole and still
// loads cached blocks after it (24 blocks: more than a pass's floor hides).
func TestPlannerLoadsAfterHoles(t *testing.T) {
	cp, err := New(newCostModel(t, "pcie5-pinned", 64))
	if err != nil {
		t.Fatal(err)
	}
	blocks := make([]kvtier.PlanBlock, 24)
	for i := range blocks {
		blocks[i] = kvtier.PlanBlock{Cached: i != 2, Tier: kvtier.Host}
	}
	acts := make([]kvtier.Action, len(blocks))
	if _, err := cp.Plan(&kvtier.PlanRequest{Blocks: blocks}, acts); err != nil {
		t.Fatal(err)
	}
	if acts[2] != kvtier.Recompute {
		t.Errorf("the hole (block 2) is planned %v, want recompute", acts[2])
	}
	if !slices.Contains(acts[3:], kvtier.Load) {
		t.Errorf("no block after the hole is loaded: %v", acts)
	}
}

// TestPlannerPricesTheWholePrompt: the planner prices the partial last
// block by its tokens and waits behind the backlog, as kvtier/cost's
// PlanQueued does for the same request.
func TestPlannerPricesTheWholePrompt(t *testing.T) {
	cp, err := New(newCostModel(t, "pcie5-pinned", 64))
	if err != nil {
		t.Fatal(err)
	}
	ref := newCostModel(t, "pcie5-pinned", 64)
	blocks := []kvtier.PlanBlock{{Cached: true, Tier: kvtier.Host}, {Cached: true, Tier: kvtier.Host}, {}, {}}
	src := []cost.BlockSource{{Tier: cost.TierHost}, {Tier: cost.TierHost}, {Tier: cost.TierMissing}, {Tier: cost.TierMissing, Tokens: 5}}
	for _, backlog := range []time.Duration{0, 3 * time.Millisecond} {
		acts := make([]kvtier.Action, len(blocks))
		est, err := cp.Plan(&kvtier.PlanRequest{Blocks: blocks, LastTokens: 5, Backlog: kvtier.Backlog{Ingress: backlog}}, acts)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]cost.Action, len(src))
		res, err := ref.PlanQueued(src, want, cost.Backlog{Link: backlog})
		if err != nil {
			t.Fatal(err)
		}
		if est.Time != res.Time || est.Time == 0 {
			t.Errorf("backlog %v: estimate %v, cost says %v", backlog, est.Time, res.Time)
		}
	}
}
