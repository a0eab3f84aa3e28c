package replay

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/trace"
)

// planCase is one case of TestReplayExecutesThePlan.
type planCase struct {
	name     string
	gpu      string
	hostLink string
	nvmeLink string
	// blocks is where each 512-token block is: L host, N NVMe, - not
	// cached; partial cuts the last block to that many tokens.
	blocks  string
	partial int
	// want is the plan's shape, as a pattern over its actions per
	// block: l load, r recompute.
	want string
}

// TestReplayExecutesThePlan: one request, alone on an idle system, whose
// cached blocks are seeded into the host and NVMe tiers, takes in the
// replay the time kvtier/cost's Planner predicted for the plan it chose,
// within 1%, for every shape of plan. The configurations are chosen so
// that the planner picks the shape named: a GPU much faster than its link
// recomputes, a fast link loads, and between them the plan mixes.
//
// Under Config.Mover "device" the copies between the GPU and the host are
// the DeviceMover's and the copy engine's, on the simulated device: an
// onboard is one copy call per layer, a descriptor per block and an event
// per layer, and a load from NVMe an onboard from staging slots of the
// blocks the drive has read, which the Planner prices; the replay's pass
// waits for each layer's events.
func TestReplayExecutesThePlan(t *testing.T) {
	cases := []planCase{
		{"all load", "h200", "pcie5-pinned", "nvme-gen4", "LLLLLLLL", 0, "^l+$"},
		{"all recompute", "b200", "pcie5-pageable", "nvme-gen4", "N", 0, "^r$"},
		{"head recompute, tail load", "b200", "pcie5-pinned", "nvme-gen4", strings.Repeat("L", 32), 0, "^r+l+$"},
		{"holes: NVMe blocks recomputed while later blocks load", "b200", "pcie5-pinned", "nvme-gen4",
			"LLLLNNNNLLLLLLLLLLLL", 0, "^l+r+l+$"},
		{"mixed host and NVMe, all loaded", "h200", "pcie5-pinned", "nvme-gen5-x4", "LLNNLN", 0, "^l+$"},
		{"mixed host and NVMe, NVMe holes recomputed", "b200", "pcie5-pinned", "nvme-gen4", "LLNNLLNNLLNN", 0, "^l+r+l+r+l+r+$"},
		{"cached prefix, missing tail, partial last block", "h200", "pcie5-pinned", "nvme-gen4", "LLLLNN----", 100, "l+r+$"},
		{"nothing cached, partial block", "h200", "pcie5-pinned", "nvme-gen4", "---", 7, "^rrr$"},
		{"one block cached: the pass floor", "h200", "pcie5-pinned", "nvme-gen4", "L", 0, "^l$"},
	}
	for _, c := range cases {
		for _, mover := range []string{MoverModel, MoverDevice} {
			var plain, slowed time.Duration
			t.Run(c.name+"/"+mover, func(t *testing.T) { plain = replayThePlan(t, mover, c, 0) })
			// A calibration whose passes compute slower while their
			// loads copy: the replay runs the pass the planner priced.
			t.Run(c.name+"/"+mover+"/load slowdown", func(t *testing.T) { slowed = replayThePlan(t, mover, c, 0.3) })
			if strings.Contains(c.want, "l") && slowed <= plain {
				t.Errorf("%s/%s: a plan with loads planned %v with a load slowdown of 0.3, %v without", c.name, mover, slowed, plain)
			}
		}
	}
}

// slowdownCalibration writes a calibration file of gpu's presets, taken
// as exact, whose passes end later by slowdown while their loads copy.
func slowdownCalibration(t *testing.T, gpu string, slowdown float64) string {
	g, err := cost.LookupGPU(gpu)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cost.NewCalibration(g)
	if err != nil {
		t.Fatal(err)
	}
	// Width 0: the presets taken as exact, as with no calibration, so
	// that the plans' shapes are the cases'.
	fit := *c.Current()
	fit.Prefill.LoadSlowdown, fit.Prefill.ErrorWidth = slowdown, 0
	b, err := json.Marshal(struct {
		Version int `json:"version"`
		cost.Fit
	}{1, fit})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "calibration.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// replayThePlan replays case c under mover, with a calibration of the
// load slowdown when it is not 0, and returns the planned time.
func replayThePlan(t *testing.T, mover string, c planCase, slowdown float64) time.Duration {
	const N, M = 'N', '-' // a block in NVMe, missing ('L': in the host tier)
	cfg := DefaultConfig()
	cfg.GPU, cfg.HostLink, cfg.NVMeLink = c.gpu, c.hostLink, c.nvmeLink
	cfg.Mover = mover
	cfg.Baselines = false
	if slowdown != 0 {
		cfg.Calibration = slowdownCalibration(t, c.gpu, slowdown)
	}
	e, err := newEngine(cfg, costplan.Cost)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.start(trace.MooncakeBlockTokens); err != nil {
		t.Fatal(err)
	}
	var seeded [kvtier.NumTiers][]kvtier.Resident
	ids := make([]string, len(c.blocks))
	for i := range c.blocks {
		ids[i] = fmt.Sprint(i + 1)
		tier := kvtier.Host
		switch c.blocks[i] {
		case M:
			continue
		case N:
			tier = kvtier.NVMe
		}
		seeded[tier] = append(seeded[tier], kvtier.Resident{Slot: kvtier.Slot(len(seeded[tier])),
			Key: kvtier.Key(i + 1), Parent: kvtier.Key(i), Position: i})
	}
	for tier, blocks := range seeded {
		if len(blocks) == 0 {
			continue
		}
		if n, err := e.m.Adopt(kvtier.Tier(tier), blocks); err != nil || n != len(blocks) {
			t.Fatalf("adopt %d blocks into %v: %d, %v", len(blocks), kvtier.Tier(tier), n, err)
		}
	}
	tokens := len(c.blocks) * trace.MooncakeBlockTokens
	if c.partial > 0 {
		tokens -= trace.MooncakeBlockTokens - c.partial
	}
	line := fmt.Sprintf(`{"timestamp": 0, "input_length": %d, "output_length": 1, "hash_ids": [%s]}`+"\n",
		tokens, strings.Join(ids, ", "))
	rd := trace.NewReader(strings.NewReader(line), trace.Options{Format: trace.FormatMooncake, Name: c.name})
	var plan kvtier.Estimate
	var got string
	e.planned = func(r *request) { plan, got = r.l1.Estimate(), planShape(r) }
	if err := e.run(rd); err != nil {
		t.Fatal(err)
	}
	// A slowdown may change the plan (a longer recompute overlaps the
	// loads longer): the shape is the case's without one.
	if slowdown == 0 && !regexp.MustCompile(c.want).MatchString(got) {
		t.Errorf("plan %s, want the shape %s", got, c.want)
	}
	if len(e.ttfts) != 1 {
		t.Fatalf("%d first tokens", len(e.ttfts))
	}
	ttft := e.ttfts[0]
	t.Logf("blocks %s, plan %s: planned %v, replayed %v (load all %v, recompute all %v, floor %v)",
		c.blocks, got, plan.Time, ttft, plan.LoadAllTime, plan.RecomputeAllTime, e.floor)
	if plan.Time <= 0 || ttft < plan.Time-plan.Time/100 || ttft > plan.Time+plan.Time/100 {
		t.Errorf("replayed TTFT %v, planned %v: not within 1%%", ttft, plan.Time)
	}
	if e.res.ForcedRecomputes != 0 || e.res.PlanErrors != 0 {
		t.Errorf("%d forced recomputes, %d plan errors", e.res.ForcedRecomputes, e.res.PlanErrors)
	}
	return plan.Time
}

// TestPassFloorOnEveryStrategy: a request whose every block is on the GPU
// still takes one forward pass: no first token comes sooner than the
// weights' read from HBM (8B on an H200: 3.3 ms).
func TestPassFloorOnEveryStrategy(t *testing.T) {
	line := `{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}` + "\n"
	// The second request finds both blocks on the GPU.
	lines := line + strings.ReplaceAll(line, `"timestamp": 0`, `"timestamp": 5000`)
	rep := runOrFail(t, stringSource("two", lines), DefaultConfig())
	floor := 16.06e9 / 4.8e12
	for _, r := range rep.Results {
		if r.TTFT.P50 < floor*0.999 || r.TTFT.Mean < floor*0.999 {
			t.Errorf("%s: TTFT p50 %.6f s, mean %.6f s, below the pass floor %.6f s", r.Strategy, r.TTFT.P50, r.TTFT.Mean, floor)
		}
	}
	if r := result(t, rep, costplan.Cost); r.UsedBlocks != 2 {
		t.Errorf("the second request used %d blocks on the GPU, want 2", r.UsedBlocks)
	}
}

// TestReportSaysWhenOverloaded: a trace that offers more prefill than the
// GPU has is flagged in the report; the bundled trace on the default
// configuration is not.
func TestReportSaysWhenOverloaded(t *testing.T) {
	var lines strings.Builder
	for i := range 8 { // 8 prompts of 8K tokens, 10 ms apart: ~0.25 s of prefill each
		ids := make([]string, 16)
		for j := range ids {
			ids[j] = fmt.Sprint(i*100 + j + 1)
		}
		fmt.Fprintf(&lines, `{"timestamp": %d, "input_length": 8192, "output_length": 1, "hash_ids": [%s]}`+"\n", 10*i, strings.Join(ids, ","))
	}
	cfg := testConfig()
	cfg.Baselines = false
	rep := runOrFail(t, stringSource("burst", lines.String()), cfg)
	var out strings.Builder
	if err := rep.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	if load := rep.Results[0].OfferedPrefillLoad; load < 10 || !strings.Contains(out.String(), "MORE THAN THE GPU CAN PREFILL") {
		t.Errorf("offered load %.2f; report:\n%s", load, out.String())
	}
	src, _ := bundled()
	rep = runOrFail(t, src, testConfig())
	out.Reset()
	if err := rep.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	if load := rep.Results[0].OfferedPrefillLoad; load <= 0 || load >= 1 || strings.Contains(out.String(), "MORE THAN") {
		t.Errorf("bundled: offered load %.2f; report:\n%s", load, out.String())
	}
}

// planShape is r's plan, block by block: l (load), r (recompute) or g
// (use, on the GPU). A block the lookup did not find is recomputed.
func planShape(r *request) string {
	shape := []byte(strings.Repeat("r", len(r.keys)))
	for _, b := range r.l1.Blocks {
		switch b.Action {
		case kvtier.Load:
			shape[b.Position] = 'l'
		case kvtier.Use:
			shape[b.Position] = 'g'
		}
	}
	return string(shape)
}

// TestStagedNVMeLoadsRunAsPlanned: under the device mover a load from NVMe
// is read by the modelled drive and copied to the GPU from staging slots,
// the blocks read while a staged copy runs going together in the next
// Submit. The agentic trace's requests whose plans load from NVMe (the 70B
// over 8 GPUs: 64-token blocks of 80 layers, no host tier) take, past
// their wait for the GPU, within 2% of their planned time in sum and each
// within 3%; with one Submit per block read they took 1.26x in sum.
func TestStagedNVMeLoadsRunAsPlanned(t *testing.T) {
	gen := trace.AgenticGenConfig()
	gen.Requests = 1000
	cfg := DefaultConfig()
	cfg.Model, cfg.TP, cfg.GPUBytes, cfg.HostBytes = "llama-3.1-70b", 8, 16<<30, 0
	cfg.Baselines, cfg.NVMeAdmission, cfg.Mover = false, "all", MoverDevice
	_, recs := collect(t, GeneratedSource("agentic", gen), cfg)
	var ran, planned float64
	n := 0
	for _, r := range recs {
		if r.LoadedNVMeBlocks == 0 || r.PlannedSeconds == 0 {
			continue
		}
		took := r.TTFTSeconds - (r.StartSeconds - r.ArrivalSeconds)
		if ratio := took / r.PlannedSeconds; ratio < 0.999 || ratio > 1.03 {
			t.Errorf("request %d: %d blocks from NVMe took %.4f s, planned %.4f s (%.3fx)", r.Index, r.LoadedNVMeBlocks, took, r.PlannedSeconds, ratio)
		}
		ran += took
		planned += r.PlannedSeconds
		n++
	}
	if n == 0 {
		t.Fatal("no request loaded from NVMe")
	}
	if ratio := ran / planned; ratio > 1.02 {
		t.Errorf("%d requests with NVMe loads took %.3f s past their wait, planned %.3f s (%.3fx)", n, ran, planned, ratio)
	}
	t.Logf("%d requests with NVMe loads: %.3fx of plan in sum", n, ran/planned)
}
