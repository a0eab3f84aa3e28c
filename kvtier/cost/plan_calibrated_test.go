package cost

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// b200Calibration is a calibration file for a B200 whose terms are the
// presets', with the given error widths for prefill and the PCIe 5 link.
func b200Calibration(t *testing.T, prefillWidth, linkWidth float64) *Calibration {
	t.Helper()
	g, _ := LookupGPU("b200")
	file := fmt.Sprintf(`{"version": 1, "gpu": "b200",
		"prefill": {"fixed_seconds": 0, "weight_bytes_per_s": 0, "linear_flops": %g, "attention_flops": %g,
		            "samples": 0, "outliers": 0, "error_width": %g},
		"links": [{"name": "pcie5-pinned", "bandwidth_bytes_per_s": 55.3e9, "latency_seconds": 2.1e-6,
		           "samples": 0, "outliers": 0, "error_width": %g}],
		"prefill_samples": [], "copy_samples": []}`, g.EffectiveFLOPS(), g.EffectiveFLOPS(), prefillWidth, linkWidth)
	c, err := LoadCalibration(strings.NewReader(file), g)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPlanPrefersTheSafeSide: a host prefix that a B200 over pinned PCIe 5
// splits (recompute a head while the tail loads). When the prefill figure
// is uncertain the plan leans on the link, when the link's is it leans on
// the GPU, and either way its time at the nominal figures is within the
// uncertainty of the nominal optimum.
func TestPlanPrefersTheSafeSide(t *testing.T) {
	blocks := make([]BlockSource, 32)
	for i := range blocks {
		blocks[i].Tier = TierHost
	}
	plan := func(cal *Calibration) (PlanResult, int) {
		p := calibratedPlanner(t, Presets{Model: "llama-3.1-8b", GPU: "b200", HostLink: "pcie5-pinned", BlockTokens: 512}, cal)
		out := make([]Action, len(blocks))
		res, err := p.Plan(blocks, out)
		if err != nil {
			t.Fatal(err)
		}
		if sim, _ := p.Simulate(blocks, out); sim != res.Time {
			t.Errorf("reported %v, nominal simulation %v", res.Time, sim)
		}
		_, rec := countActions(out)
		return res, rec
	}
	exact, recExact := plan(nil)
	same, recSame := plan(b200Calibration(t, 0, 0))
	gpuUnsure, recGPU := plan(b200Calibration(t, 0.3, 0))
	linkUnsure, recLink := plan(b200Calibration(t, 0, 0.3))
	t.Logf("recomputed: presets %d, exact calibration %d, uncertain prefill %d, uncertain link %d", recExact, recSame, recGPU, recLink)
	if recExact == 0 || recExact == len(blocks) || recSame != recExact || same.Time != exact.Time {
		t.Fatalf("want a split plan, the same with an exact calibration: %d/%v and %d/%v", recExact, exact.Time, recSame, same.Time)
	}
	if recGPU >= recExact || recLink <= recExact {
		t.Errorf("uncertain prefill recomputes %d, uncertain link %d, exact %d: want fewer, more", recGPU, recLink, recExact)
	}
	for _, r := range []PlanResult{gpuUnsure, linkUnsure} {
		if r.Time < exact.Time || float64(r.Time) > 1.3*float64(exact.Time) {
			t.Errorf("careful plan %v against the nominal optimum %v", r.Time, exact.Time)
		}
	}
}

// TestPlannerFollowsItsCalibration: measured prefills 3x slower than the
// presets reach the next plan, which then loads what it recomputed; the
// pass cost the fit finds is in the plan's time.
func TestPlannerFollowsItsCalibration(t *testing.T) {
	g, _ := LookupGPU("b200")
	cal, err := NewCalibration(g)
	if err != nil {
		t.Fatal(err)
	}
	p := calibratedPlanner(t, Presets{Model: "llama-3.1-8b", GPU: "b200", HostLink: "pcie5-pinned", BlockTokens: 512}, cal)
	blocks := make([]BlockSource, 32)
	for i := range blocks {
		blocks[i].Tier = TierHost
	}
	out := make([]Action, len(blocks))
	if _, err := p.Plan(blocks, out); err != nil {
		t.Fatal(err)
	}
	_, before := countActions(out)
	cost0 := p.BlockRecomputeCost(5)
	m := p.cfg.Model
	for _, tokens := range []int{256, 512, 1024, 2048, 4096, 8192, 16384, 512, 2048, 8192} {
		preset := PresetPrefillCost(&m, &g, 1)
		d := time.Duration(3 * preset.Seconds(tokens, 0) * 1e9)
		if err := cal.AddPrefill(m, 1, 0, tokens, d); err != nil {
			t.Fatal(err)
		}
	}
	res, err := p.Plan(blocks, out)
	if err != nil {
		t.Fatal(err)
	}
	_, after := countActions(out)
	if c := p.BlockRecomputeCost(5); math.Abs(c.Seconds()/cost0.Seconds()-3) > 0.3 {
		t.Errorf("block 5 costs %v after a 3x slower calibration, %v before", c, cost0)
	}
	if after >= before {
		t.Errorf("recomputed %d blocks after the GPU proved 3x slower, %d before", after, before)
	}
	if sim, _ := p.Simulate(blocks, out); sim != res.Time {
		t.Errorf("plan %v, simulation %v", res.Time, sim)
	}
}

// calibratedPlanner is the planner of presets priced by cal.
func calibratedPlanner(t testing.TB, presets Presets, cal *Calibration) *Planner {
	t.Helper()
	cfg, err := NewPlannerConfig(presets)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Calibration = cal
	p, err := NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
