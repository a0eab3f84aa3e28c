package cost

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func testPlanner(t testing.TB, maxBlocks int, paths map[Tier]Path) *Planner {
	t.Helper()
	m, _ := LookupModel("llama-3.1-8b")
	g, _ := LookupGPU("h200")
	// No pass floor: these tests check the block model, which a 3 ms
	// floor over plans of a few 16-token blocks would hide.
	// TestPlanPassFloor checks the floor.
	g.HBMBytesPerS = 0
	cfg := PlannerConfig{Model: m, GPU: g, TP: 1, BlockTokens: 16, MaxBlocks: maxBlocks}
	for tier, p := range paths {
		cfg.Paths[tier] = p
	}
	p, err := NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func hostPath(gbps float64, lat time.Duration) Path {
	return DirectPath(Link{Name: "host", BandwidthBytesPerS: gbps * 1e9, Latency: lat})
}

// bruteForce tries every choice of load or recompute for the loadable
// blocks and returns the fastest time under Simulate.
func bruteForce(t *testing.T, p *Planner, blocks []BlockSource) float64 {
	var loadable []int
	actions := make([]Action, len(blocks))
	for i, b := range blocks {
		switch {
		case b.Tier == TierGPU:
			actions[i] = ActionNone
		case b.Tier == TierMissing:
			actions[i] = ActionRecompute
		default:
			loadable = append(loadable, i)
		}
	}
	best := math.Inf(1)
	for mask := 0; mask < 1<<len(loadable); mask++ {
		for bit, i := range loadable {
			actions[i] = ActionLoad
			if mask&(1<<bit) != 0 {
				actions[i] = ActionRecompute
			}
		}
		d, err := p.Simulate(blocks, actions)
		if err != nil {
			t.Fatal(err)
		}
		best = math.Min(best, d.Seconds())
	}
	return best
}

func randomBlocks(r *rand.Rand, n int, tiers []Tier) []BlockSource {
	b := make([]BlockSource, n)
	for i := range b {
		b[i].Tier = tiers[r.IntN(len(tiers))]
	}
	return b
}

// checkPlan runs Plan and checks that its actions fit, that its reported
// time is what Simulate makes of its actions, and returns that time.
func checkPlan(t *testing.T, p *Planner, blocks []BlockSource) (PlanResult, []Action) {
	t.Helper()
	out := make([]Action, len(blocks))
	res, err := p.Plan(blocks, out)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := p.Simulate(blocks, out)
	if err != nil {
		t.Fatalf("plan's actions do not fit its blocks: %v", err)
	}
	if d := sim - res.Time; d < -time.Nanosecond || d > time.Nanosecond {
		t.Fatalf("plan says %v, simulation of its actions %v", res.Time, sim)
	}
	if res.Time > res.LoadAllTime || res.Time > res.RecomputeAllTime {
		t.Fatalf("plan %v worse than load-all %v or recompute-all %v", res.Time, res.LoadAllTime, res.RecomputeAllTime)
	}
	return res, out
}

// TestPlanExactOneTier: with one loadable tier, Plan equals brute force.
func TestPlanExactOneTier(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	tiers := []Tier{TierGPU, TierHost, TierHost, TierHost, TierMissing}
	decisions := map[[2]bool]int{}
	for iter := 0; iter < 3000; iter++ {
		// Per-block load time from 0.1x to 10x a block's recompute.
		gbps := math.Exp(r.Float64()*math.Log(1000)) * 0.05
		lat := time.Duration(r.IntN(3)) * time.Duration(r.IntN(2000)) * time.Microsecond
		p := testPlanner(t, 12, map[Tier]Path{TierHost: hostPath(gbps, lat)})
		blocks := randomBlocks(r, 1+r.IntN(12), tiers)
		res, out := checkPlan(t, p, blocks)
		want := bruteForce(t, p, blocks)
		if math.Abs(res.Time.Seconds()-want) > 2e-9 {
			t.Fatalf("iter %d: blocks %v: plan %v (%v), brute force %g s", iter, blocks, res.Time, out, want)
		}
		decisions[[2]bool{res.LoadBlocks > 0, res.RecomputeBlocks > 0}]++
	}
	// The random cases must exercise loading, recomputing and mixing.
	if len(decisions) < 4 {
		t.Fatalf("random cases too tame: %v", decisions)
	}
}

// TestPlanMixedTiers: with several loadable tiers Plan searches nested cuts.
// It is never better than brute force (that would be a modelling bug), and
// on these cases almost always equal to it. The gap is reported.
func TestPlanMixedTiers(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	tiers := []Tier{TierGPU, TierHost, TierNVMe, TierRemote, TierMissing}
	worst, exact, total := 1.0, 0, 0
	for iter := 0; iter < 1500; iter++ {
		paths := map[Tier]Path{}
		ingress := Link{Name: "pcie", BandwidthBytesPerS: math.Exp(r.Float64()*math.Log(100)) * 0.5e9, Latency: time.Duration(r.IntN(50)) * time.Microsecond}
		paths[TierHost] = DirectPath(ingress)
		paths[TierNVMe] = Path{Source: Link{Name: "nvme", BandwidthBytesPerS: ingress.BandwidthBytesPerS / (1 + 5*r.Float64()), Latency: time.Duration(r.IntN(500)) * time.Microsecond}, Ingress: ingress, Pipelined: r.IntN(2) == 0}
		paths[TierRemote] = Path{Source: Link{Name: "rdma", BandwidthBytesPerS: ingress.BandwidthBytesPerS * (0.5 + r.Float64()), Latency: 5 * time.Microsecond}, Ingress: ingress, Pipelined: true}
		p := testPlanner(t, 10, paths)
		blocks := randomBlocks(r, 1+r.IntN(10), tiers)
		res, _ := checkPlan(t, p, blocks)
		want := bruteForce(t, p, blocks)
		got := res.Time.Seconds()
		if got < want-2e-9 {
			t.Fatalf("plan %g s beats brute force %g s: the closed form and the simulation disagree", got, want)
		}
		total++
		if got <= want+2e-9 {
			exact++
		} else if ratio := got / want; ratio > worst {
			worst = ratio
		}
	}
	t.Logf("mixed tiers: optimal in %d of %d cases, worst ratio to optimum %.3f", exact, total, worst)
	if worst > 1.1 || exact < total*95/100 {
		t.Errorf("optimal in %d of %d, worst ratio to optimum %.3f", exact, total, worst)
	}
}

func TestPlanShapes(t *testing.T) {
	p := testPlanner(t, 128, map[Tier]Path{TierHost: hostPath(50, 3*time.Microsecond)})
	// Empty prefix: nothing to do.
	res, err := p.Plan(nil, nil)
	if err != nil || res != (PlanResult{}) {
		t.Fatalf("empty: %+v %v", res, err)
	}
	// All on the GPU: nothing to do, time 0.
	blocks := make([]BlockSource, 8)
	res, out := checkPlan(t, p, blocks)
	if res.Time != 0 || res.LoadBlocks+res.RecomputeBlocks != 0 || out[3] != ActionNone {
		t.Fatalf("all on GPU: %+v %v", res, out)
	}
	// A missing block in the middle of host blocks is recomputed; most of
	// the others load (an 8B block reloads in ~42 us and recomputes in
	// ~0.43 ms), but a recomputed head of about ten blocks overlaps the 5 ms
	// of loads and beats loading everything.
	blocks = make([]BlockSource, 128)
	for i := range blocks {
		blocks[i].Tier = TierHost
	}
	blocks[64].Tier = TierMissing
	res, out = checkPlan(t, p, blocks)
	if out[64] != ActionRecompute || out[0] != ActionRecompute || out[127] != ActionLoad ||
		res.RecomputeBlocks < 5 || res.RecomputeBlocks > 20 || res.Time >= res.LoadAllTime {
		t.Fatalf("missing in the middle: %+v", res)
	}
	// Over a very slow link, a recompute prefix overlaps the loads.
	slow := testPlanner(t, 128, map[Tier]Path{TierHost: hostPath(0.5, 0)})
	res, out = checkPlan(t, slow, blocks[:64])
	if out[0] != ActionRecompute || out[63] != ActionLoad || res.Time >= res.LoadAllTime || res.Time >= res.RecomputeAllTime {
		t.Fatalf("slow link: %+v", res)
	}
}

func TestPlanRejects(t *testing.T) {
	p := testPlanner(t, 4, map[Tier]Path{TierHost: hostPath(50, 0)})
	out := make([]Action, 8)
	for _, c := range []struct {
		blocks  []BlockSource
		out     []Action
		mention string
	}{
		{make([]BlockSource, 3), out[:2], "out has 2"},
		{[]BlockSource{{Tier: TierHost}, {Tier: TierNVMe}}, out, "block 1: tier nvme has no path"},
		{[]BlockSource{{Tier: Tier(9)}}, out, "block 0"},
	} {
		for i := range out {
			out[i] = NumActions
		}
		_, err := p.Plan(c.blocks, c.out)
		if err == nil || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("want error mentioning %q, got %v", c.mention, err)
		}
		for i := range out {
			if out[i] != NumActions {
				t.Fatal("Plan wrote out on error")
			}
		}
	}
	if _, err := p.Simulate([]BlockSource{{Tier: TierMissing}}, []Action{ActionLoad}); err == nil {
		t.Error("simulate accepted loading a missing block")
	}
	if _, err := p.Simulate([]BlockSource{{Tier: TierGPU}}, []Action{ActionRecompute}); err == nil {
		t.Error("simulate accepted recomputing a GPU block")
	}
	if _, err := p.Simulate([]BlockSource{{Tier: TierGPU}}, nil); err == nil {
		t.Error("simulate accepted mismatched lengths")
	}
}

func TestNewPlannerRejects(t *testing.T) {
	m, _ := LookupModel("llama-3.1-8b")
	g, _ := LookupGPU("h200")
	good := PlannerConfig{Model: m, GPU: g, TP: 1, BlockTokens: 16, MaxBlocks: 128}
	good.Paths[TierHost] = hostPath(50, 0)
	if _, err := NewPlanner(good); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		mention string
		edit    func(*PlannerConfig)
	}{
		{"layers", func(c *PlannerConfig) { c.Model.Layers = 0 }},
		{"efficiency", func(c *PlannerConfig) { c.GPU.Efficiency = 0 }},
		{"tp", func(c *PlannerConfig) { c.TP = 0 }},
		{"block_tokens", func(c *PlannerConfig) { c.BlockTokens = 0 }},
		{"max_blocks", func(c *PlannerConfig) { c.MaxBlocks = -1 }},
		{"no tier has a path", func(c *PlannerConfig) { c.Paths[TierHost] = Path{} }},
		{"bandwidth", func(c *PlannerConfig) { c.Paths[TierNVMe] = Path{Ingress: Link{Name: "x"}} }},
		{"takes no path", func(c *PlannerConfig) { c.Paths[TierGPU] = hostPath(1, 0) }},
	}
	for _, c := range cases {
		cfg := good
		c.edit(&cfg)
		if _, err := NewPlanner(cfg); err == nil || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("want error mentioning %q, got %v", c.mention, err)
		}
	}
}

// plan128 is a 128-block prefix as the block manager sees it: a head on
// the GPU, most in host memory, a stretch on NVMe, two blocks evicted.
func plan128(t testing.TB) (*Planner, []BlockSource, []Action) {
	pcie, _ := LookupLink("pcie5-pinned")
	nvme, _ := LookupLink("nvme-gen5")
	p := testPlanner(t, 128, map[Tier]Path{
		TierHost: DirectPath(pcie),
		TierNVMe: {Source: nvme, Ingress: pcie, Pipelined: true},
	})
	blocks := make([]BlockSource, 128)
	for i := range blocks {
		switch {
		case i < 16:
			blocks[i].Tier = TierGPU
		case i >= 80 && i < 112:
			blocks[i].Tier = TierNVMe
		default:
			blocks[i].Tier = TierHost
		}
	}
	blocks[40].Tier, blocks[90].Tier = TierMissing, TierMissing
	return p, blocks, make([]Action, 128)
}

func TestPlanAllocatesNothing(t *testing.T) {
	p, blocks, out := plan128(t)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := p.Plan(blocks, out); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Plan allocates %v times per call", allocs)
	}
}

func BenchmarkPlan128(b *testing.B) {
	p, blocks, out := plan128(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Plan(blocks, out); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlan128OneTier is the common case, a prefix on the GPU and in
// host memory only: the single-cut passes, no nested search.
func BenchmarkPlan128OneTier(b *testing.B) {
	p, blocks, out := plan128(b)
	for i := range blocks {
		if blocks[i].Tier == TierNVMe {
			blocks[i].Tier = TierHost
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Plan(blocks, out); err != nil {
			b.Fatal(err)
		}
	}
}

func TestNewPlannerConfig(t *testing.T) {
	cfg, err := NewPlannerConfig(Presets{Model: "llama-3.1-70b", GPU: "h200", HostLink: "pcie5-pinned", NVMe: "nvme-gen5-x4", BlockTokens: 16, MaxBlocks: 256})
	if err != nil {
		t.Fatal(err)
	}
	probe, err := LoadProbe("testdata/probe-h200.json")
	if err != nil {
		t.Fatal(err)
	}
	cfg.SetIngress(probe.Pinned)
	if cfg.Paths[TierNVMe].Ingress.Name != "probe-pcie5-x16-pinned" || cfg.Paths[TierNVMe].Source.Name != "nvme-gen5-x4" ||
		cfg.Paths[TierRemote].Source.Name != "rdma-400g" || cfg.Paths[TierGPU] != (Path{}) {
		t.Fatalf("paths: %+v", cfg.Paths)
	}
	p, err := NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	blocks := []BlockSource{{Tier: TierGPU}, {Tier: TierHost}, {Tier: TierNVMe}, {Tier: TierRemote}, {Tier: TierMissing}}
	checkPlan(t, p, blocks)
	// A 70B block of 16 tokens: 5 MiB, ~0.1 ms over the measured 53 GB/s;
	// its recompute, ~3.8 ms at 593 TFLOP/s.
	if c := p.BlockRecomputeCost(0); c < 3*time.Millisecond || c > 5*time.Millisecond {
		t.Errorf("block recompute cost %v", c)
	}
	if p.BlockRecomputeCost(255) <= p.BlockRecomputeCost(0) {
		t.Error("a later block must cost more to recompute (it attends to more context)")
	}
	cfg2, _ := NewPlannerConfig(Presets{Model: "llama-3.1-8b", GPU: "h100-sxm", HostLink: "pcie4-pinned", BlockTokens: 16, MaxBlocks: 8})
	if cfg2.Paths[TierNVMe] != (Path{}) {
		t.Error("nvme \"\" must leave the tier unplanned")
	}
	for _, bad := range [][4]string{
		{"nope", "h200", "pcie5-pinned", ""},
		{"llama-3.1-8b", "nope", "pcie5-pinned", ""},
		{"llama-3.1-8b", "h200", "nope", ""},
		{"llama-3.1-8b", "h200", "pcie5-pinned", "nope"},
	} {
		if _, err := NewPlannerConfig(Presets{Model: bad[0], GPU: bad[1], HostLink: bad[2], NVMe: bad[3], BlockTokens: 16, MaxBlocks: 8}); !errors.Is(err, ErrUnknownName) {
			t.Errorf("%v: %v", bad, err)
		}
	}
	if cfg2.TP != 1 {
		t.Errorf("Presets.TP 0: PlannerConfig.TP %d, want 1", cfg2.TP)
	}
	neg, err := NewPlannerConfig(Presets{Model: "llama-3.1-8b", GPU: "h200", HostLink: "pcie5-pinned", TP: -2, BlockTokens: 16, MaxBlocks: 8})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewPlanner(neg); err == nil || !strings.Contains(err.Error(), "tp") {
		t.Errorf("Presets.TP -2: NewPlanner %v, want an error naming tp", err)
	}
}

// TestPlanPassFloor: no plan is shorter than one forward pass's read of the
// weights, and the floor is Scenario's figure.
func TestPlanPassFloor(t *testing.T) {
	m, _ := LookupModel("llama-3.1-8b")
	g, _ := LookupGPU("h200")
	cfg := PlannerConfig{Model: m, GPU: g, TP: 1, BlockTokens: 16, MaxBlocks: 64}
	cfg.Paths[TierHost] = hostPath(50, 3*time.Microsecond)
	p, err := NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := Scenario{Model: m, GPU: g, TP: 1}
	floor := p.PassFloor()
	// 8.03e9 bf16 parameters are 16.06 GB; over 4.8 TB/s, 3.346 ms.
	if want := 16.06e9 / 4.8e12; math.Abs(floor.Seconds()-want) > 1e-6 || floor != s.PassFloor() {
		t.Fatalf("floor %v, Scenario's %v, want %.4g s", floor, s.PassFloor(), want)
	}
	for _, tier := range []Tier{TierGPU, TierHost, TierMissing} {
		blocks := make([]BlockSource, 4)
		for i := range blocks {
			blocks[i].Tier = tier
		}
		res, out := checkPlan(t, p, blocks)
		// Loading them, the pass's first layer waits for theirs: 3 us
		// for the copy call and one of 32 layers of 4 blocks of 2 MiB at 50 GB/s.
		loadAll := floor
		if tier == TierHost {
			loadAll += seconds(3e-6 + 4*float64(2<<20)/50e9/32)
		}
		if res.Time != floor || absDur(res.LoadAllTime-loadAll) > time.Nanosecond || res.RecomputeAllTime != floor {
			t.Errorf("4 blocks in %v: %+v, want the plan at the floor %v, loading all at %v", tier, res, floor, loadAll)
		}
		if got, err := p.Simulate(blocks, out); err != nil || got != floor {
			t.Errorf("4 blocks in %v: Simulate %v %v, want %v", tier, got, err, floor)
		}
	}
	// 64 missing blocks of 16 tokens (1,024 tokens) prefill in about 28 ms:
	// above the floor, which then changes nothing.
	blocks := make([]BlockSource, 64)
	for i := range blocks {
		blocks[i].Tier = TierMissing
	}
	res, _ := checkPlan(t, p, blocks)
	if want := s.RecomputeTime(1024, 0, true); res.Time <= floor || absDur(res.Time-want) > time.Microsecond {
		t.Errorf("1,024 missing tokens: %v, want %v (above the floor %v)", res.Time, want, floor)
	}
}

// TestPlanPartialBlock: a trailing block of 3 tokens recomputes 3 tokens,
// not 16; a bad token count is an error naming the block.
func TestPlanPartialBlock(t *testing.T) {
	p := testPlanner(t, 8, map[Tier]Path{TierHost: hostPath(50, 3*time.Microsecond)})
	s := Scenario{Model: p.cfg.Model, GPU: p.cfg.GPU, TP: 1}
	blocks := []BlockSource{{Tier: TierMissing}, {Tier: TierMissing}, {Tier: TierMissing, Tokens: 3}}
	res, _ := checkPlan(t, p, blocks)
	if want := s.RecomputeTime(35, 0, true); absDur(res.Time-want) > 2*time.Nanosecond {
		t.Errorf("16+16+3 missing tokens: %v, want %v", res.Time, want)
	}
	full := []BlockSource{{Tier: TierMissing}, {Tier: TierMissing}, {Tier: TierMissing}}
	if resFull, _ := checkPlan(t, p, full); resFull.Time <= res.Time {
		t.Errorf("three full blocks %v not dearer than two and a partial %v", resFull.Time, res.Time)
	}
	out := make([]Action, 3)
	for _, bad := range []int{-1, 17} {
		blocks[2].Tokens = bad
		if _, err := p.Plan(blocks, out); err == nil || !strings.Contains(err.Error(), "block 2: tokens") {
			t.Errorf("tokens %d: %v, want an error naming block 2's tokens", bad, err)
		}
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// TestPlanTimesAsTheFitPrices: a plan's reported time is what the fit
// says the pass costs, where the pairs among the pass's new tokens and
// those with the tokens present run at different rates and the pass reads
// the present tokens' KV: a suffix recomputed after GPU blocks takes
// exactly Seconds(suffix, prefix), and BlockSeconds summed over its blocks
// is MarginalSeconds.
func TestPlanTimesAsTheFitPrices(t *testing.T) {
	g, _ := LookupGPU("h200")
	m, _ := LookupModel("llama-3.1-8b")
	cal, err := LoadCalibration(strings.NewReader(`{"version": 1, "gpu": "h200", "prefill": {"fixed_seconds": 0.004,
		"linear_flops": 6e14, "attention_flops": 1.4e14, "prefix_attention_flops": 2.6e14, "prefix_read_bytes_per_s": 5e11}}`), g)
	if err != nil {
		t.Fatal(err)
	}
	p := calibratedPlanner(t, Presets{Model: "llama-3.1-8b", GPU: "h200", HostLink: "pcie5-pinned", BlockTokens: 16}, cal)
	pc := cal.Current().PrefillCost(&m, &g, 1)
	const gpu, missing = 40, 200 // blocks of 16 tokens
	blocks := make([]BlockSource, gpu+missing)
	for i := range blocks {
		blocks[i].Tier = TierMissing
		if i < gpu {
			blocks[i].Tier = TierGPU
		}
	}
	out := make([]Action, len(blocks))
	res, err := p.Plan(blocks, out)
	if err != nil {
		t.Fatal(err)
	}
	want := pc.Time(missing*16, gpu*16)
	if d := res.Time - want; d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("a suffix of %d tokens after %d on the GPU: planned %v, the fit prices it %v", missing*16, gpu*16, res.Time, want)
	}
	sum := 0.0
	for j := range missing {
		sum += pc.BlockSeconds(16, j*16, gpu*16)
	}
	if w := pc.MarginalSeconds(missing*16, gpu*16); math.Abs(sum/w-1) > 1e-12 {
		t.Errorf("BlockSeconds summed over the suffix %g s, MarginalSeconds %g s", sum, w)
	}
	if got, err := p.Simulate(blocks, out); err != nil || got != res.Time {
		t.Errorf("Simulate of the plan: %v, %v; want the plan's %v", got, err, res.Time)
	}
}
