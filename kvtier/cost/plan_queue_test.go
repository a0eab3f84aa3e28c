package cost

import (
	"math"
	"strings"
	"testing"
	"time"
)

// longPrefix is n blocks as a long agentic context sees them: a head on
// the GPU, then host, a stretch on NVMe, host again, and a missing tail.
func longPrefix(n int) []BlockSource {
	blocks := make([]BlockSource, n)
	for i := range blocks {
		switch {
		case i < n/8:
			blocks[i].Tier = TierGPU
		case i < n/2:
			blocks[i].Tier = TierHost
		case i < 5*n/8:
			blocks[i].Tier = TierNVMe
		case i < 7*n/8:
			blocks[i].Tier = TierHost
		default:
			blocks[i].Tier = TierMissing
		}
	}
	return blocks
}

func longPlanner(t testing.TB) *Planner {
	t.Helper()
	cfg, err := NewPlannerConfig(Presets{Model: "llama-3.1-8b", GPU: "h200", HostLink: "pcie5-pinned", NVMe: "nvme-gen4", BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPlanAnyLength: a request of 65,536 blocks (1M tokens of 16), 64 times
// the scratch space the planner started with, is planned; once planned,
// planning it again allocates nothing. Its time agrees with Simulate. How
// fast it plans is BenchmarkPlanAnyLength's to say, not a test's.
func TestPlanAnyLength(t *testing.T) {
	p := longPlanner(t)
	blocks := longPrefix(65536)
	out := make([]Action, len(blocks))
	res, err := p.Plan(blocks, out)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := p.Simulate(blocks, out)
	if err != nil {
		t.Fatal(err)
	}
	if d := math.Abs(float64(sim - res.Time)); d > 1e-6*float64(res.Time) {
		t.Errorf("planned %v, simulated %v", res.Time, sim)
	}
	if res.LoadBlocks+res.RecomputeBlocks != len(blocks)-len(blocks)/8 || res.Time > res.LoadAllTime || res.Time > res.RecomputeAllTime {
		t.Errorf("65,536 blocks: %+v", res)
	}
	if allocs := testing.AllocsPerRun(3, func() {
		if _, err := p.Plan(blocks, out); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("a plan of 65,536 blocks allocates %v times", allocs)
	}
}

// BenchmarkPlanAnyLength is TestPlanAnyLength's request of 65,536 blocks,
// planned again and again once the scratch space has grown: how fast a plan
// of any length is. Read it on an idle machine, without -race and without
// the invariants tag (each slows the plan down):
//
//	go test ./kvtier/cost -run '^$' -bench PlanAnyLength -count 5
func BenchmarkPlanAnyLength(b *testing.B) {
	p := longPlanner(b)
	blocks := longPrefix(65536)
	out := make([]Action, len(blocks))
	if _, err := p.Plan(blocks, out); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Plan(blocks, out); err != nil {
			b.Fatal(err)
		}
	}
}

// queuedTime runs a host-only plan's pass layer by layer behind the
// queues, written out here independently of the planner: layer l of the n
// loads lands at link + (l+1)·(call + n·(descriptor + s/L) + event), and
// layer l computes for work/L once layer l-1 is done and layer l has
// landed, the first no sooner than gpu; work is the recompute plus the
// pass's cost, no less than the floor.
func queuedTime(p *Planner, blocks []BlockSource, out []Action, q Backlog) time.Duration {
	c := p.costs.Load()
	bt, L := p.cfg.BlockTokens, p.cfg.Model.Layers
	in := p.cfg.Paths[TierHost].Ingress
	n, comp := 0, 0.0
	for i, b := range blocks {
		switch out[i] {
		case ActionLoad:
			if b.Tier != TierHost {
				panic("queuedTime prices host loads only")
			}
			n++
		case ActionRecompute:
			comp += c.prefill.MarginalSeconds(bt, i*bt)
		}
	}
	work := max(c.prefill.FloorSeconds, c.prefill.PassSeconds+comp)
	s := float64(p.cfg.Model.KVBytesPerTokenPerRank(p.cfg.TP)*int64(bt)) / in.BandwidthBytesPerS
	u := in.Latency.Seconds() + float64(n)*(in.DescriptorCost.Seconds()+s/float64(L)) + in.EventCost.Seconds()
	end := q.GPU.Seconds()
	for l := range L {
		ready := 0.0
		if n > 0 {
			ready = q.Link.Seconds() + float64(l+1)*u
		}
		end = max(end, ready) + work/float64(L)
	}
	return seconds(end)
}

func countActions(out []Action) (load, recompute int) {
	for _, a := range out {
		switch a {
		case ActionLoad:
			load++
		case ActionRecompute:
			recompute++
		}
	}
	return load, recompute
}

// TestPlanBehindABusyLink: a host prefix that mostly loads on an idle link
// (a recomputed head overlaps the loads) is recomputed, more of it the longer the copies queued ahead of it; its
// time is what the recurrences give behind the queue, and never more than
// loading or recomputing everything behind it.
func TestPlanBehindABusyLink(t *testing.T) {
	p := longPlanner(t)
	blocks := make([]BlockSource, 256)
	for i := range blocks {
		blocks[i].Tier = TierHost
	}
	out := make([]Action, len(blocks))
	prev := -1
	for _, busy := range []time.Duration{0, 5 * time.Millisecond, 20 * time.Millisecond, 80 * time.Millisecond, time.Second} {
		q := Backlog{Link: busy}
		res, err := p.PlanQueued(blocks, out, q)
		if err != nil {
			t.Fatal(err)
		}
		_, rec := countActions(out)
		want := queuedTime(p, blocks, out, q)
		t.Logf("link busy %v: %d of 256 recomputed, %v (load all %v, recompute all %v)", busy, rec, res.Time, res.LoadAllTime, res.RecomputeAllTime)
		if math.Abs(float64(res.Time-want)) > 1e-6*float64(want) {
			t.Errorf("link busy %v: planned %v, recurrences %v", busy, res.Time, want)
		}
		if res.Time > res.LoadAllTime || res.Time > res.RecomputeAllTime {
			t.Errorf("link busy %v: %+v", busy, res)
		}
		if busy == 0 && rec > len(blocks)/8 {
			t.Errorf("idle link: %d recomputed, want most loaded", rec)
		}
		if rec < prev {
			t.Errorf("link busy %v: %d recomputed, fewer than with a less busy link (%d)", busy, rec, prev)
		}
		prev = rec
	}
	if prev != len(blocks) {
		t.Errorf("behind a second of copies: %d recomputed, want all", prev)
	}
}

// TestPlanBehindABusyGPU: a prefix that a fast GPU recomputes on an idle
// system is loaded, more of it the longer the prefill queued ahead of it.
func TestPlanBehindABusyGPU(t *testing.T) {
	cfg, err := NewPlannerConfig(Presets{Model: "llama-3.1-8b", GPU: "b200", HostLink: "pcie5-pageable", BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	blocks := make([]BlockSource, 128)
	for i := range blocks {
		blocks[i].Tier = TierHost
	}
	out := make([]Action, len(blocks))
	prev := len(blocks) + 1
	for _, busy := range []time.Duration{0, 10 * time.Millisecond, 40 * time.Millisecond, time.Second} {
		q := Backlog{GPU: busy}
		res, err := p.PlanQueued(blocks, out, q)
		if err != nil {
			t.Fatal(err)
		}
		_, rec := countActions(out)
		want := queuedTime(p, blocks, out, q)
		t.Logf("GPU busy %v: %d of 128 recomputed, %v", busy, rec, res.Time)
		if math.Abs(float64(res.Time-want)) > 1e-6*float64(want) {
			t.Errorf("GPU busy %v: planned %v, recurrences %v", busy, res.Time, want)
		}
		if busy == 0 && rec < len(blocks)/2 {
			t.Errorf("idle GPU: %d of %d recomputed, want most", rec, len(blocks))
		}
		if rec > prev {
			t.Errorf("GPU busy %v: %d recomputed, more than with a less busy GPU (%d)", busy, rec, prev)
		}
		prev = rec
	}
	if prev != 0 {
		t.Errorf("behind a second of prefill: %d recomputed, want none", prev)
	}
	if _, err := p.PlanQueued(blocks, out, Backlog{Link: -1}); err == nil || !strings.Contains(err.Error(), "negative backlog") {
		t.Errorf("negative backlog: %v", err)
	}
}

// TestPlanBehindTheDrive: a prefix on NVMe behind a busy drive starts its
// loads only once the drive's queue is done, so the plan recomputes more
// of it and takes at least the drive's backlog; a host prefix does not
// care. BlockLoadCost prices one block alone on its path.
func TestPlanBehindTheDrive(t *testing.T) {
	p := longPlanner(t)
	nvme := make([]BlockSource, 64)
	host := make([]BlockSource, 64)
	for i := range nvme {
		nvme[i].Tier, host[i].Tier = TierNVMe, TierHost
	}
	out := make([]Action, 64)
	idle, err := p.PlanQueued(nvme, out, Backlog{})
	if err != nil {
		t.Fatal(err)
	}
	const drive = 20 * time.Millisecond
	busy, err := p.PlanQueued(nvme, out, Backlog{Drive: drive})
	if err != nil {
		t.Fatal(err)
	}
	if busy.RecomputeBlocks <= idle.RecomputeBlocks || busy.Time <= idle.Time {
		t.Errorf("behind a %v drive: %+v; idle: %+v; want more recomputed and later", drive, busy, idle)
	}
	if busy.LoadBlocks > 0 && busy.Time < drive {
		t.Errorf("a plan that loads from a drive busy for %v ends at %v", drive, busy.Time)
	}
	h0, _ := p.PlanQueued(host, out, Backlog{})
	h1, _ := p.PlanQueued(host, out, Backlog{Drive: drive})
	if h0 != h1 {
		t.Errorf("a host prefix behind a busy drive: %+v, idle %+v", h1, h0)
	}
	if _, err := p.PlanQueued(nvme, out, Backlog{Drive: -1}); err == nil {
		t.Error("a negative drive backlog was accepted")
	}
	if l, h := p.BlockLoadCost(TierNVMe), p.BlockLoadCost(TierHost); l <= h || h <= 0 || p.BlockLoadCost(TierGPU) != 0 {
		t.Errorf("BlockLoadCost: nvme %v, host %v, gpu %v", l, h, p.BlockLoadCost(TierGPU))
	}
}
