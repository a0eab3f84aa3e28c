package replay

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/trace"
)

// seedEngine starts a cost-strategy engine on cfg and seeds each request's
// 512-token blocks into the host tier: request r's block i has key
// 1000*r+i+1 and hash id the same.
func seedEngine(t *testing.T, cfg Config, requests, blocks int) *engine {
	t.Helper()
	e := startedEngine(t, cfg)
	var res []kvtier.Resident
	for r := range requests {
		for i := range blocks {
			key := kvtier.Key(1000*r + i + 1)
			parent := key - 1
			if i == 0 {
				parent = 0
			}
			res = append(res, kvtier.Resident{Slot: kvtier.Slot(len(res)), Key: key, Parent: parent, Position: i})
		}
	}
	if n, err := e.m.Adopt(kvtier.Host, res); err != nil || n != len(res) {
		t.Fatalf("adopt %d blocks: %d, %v", len(res), n, err)
	}
	return e
}

func requestLines(requests, blocks int) string {
	var lines strings.Builder
	for r := range requests {
		ids := make([]string, blocks)
		for i := range ids {
			ids[i] = fmt.Sprint(1000*r + i + 1)
		}
		fmt.Fprintf(&lines, `{"timestamp": 0, "input_length": %d, "output_length": 1, "hash_ids": [%s]}`+"\n",
			blocks*trace.MooncakeBlockTokens, strings.Join(ids, ", "))
	}
	return lines.String()
}

// writeCalibration fits the H200 samples measured under PyTorch (issue 15,
// benchmarks/results/prefill-h200.json) and writes the calibration file.
func writeCalibration(t *testing.T) string {
	t.Helper()
	return writeCalibrationFrom(t, "../cost/testdata/prefill-h200-pytorch.jsonl")
}

// writeCalibrationFrom fits the H200 prefill samples in the file and
// writes the calibration file.
func writeCalibrationFrom(t *testing.T, samplesPath string) string {
	t.Helper()
	g, _ := cost.LookupGPU("h200")
	cal, err := cost.NewCalibration(g)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(samplesPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	samples, err := cost.ReadPrefillSamples(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := cal.AddPrefillSamples(samples...); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "h200.json")
	if err := cal.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestReplayExecutesTheCalibratedPlan: with a calibration (measured rates,
// a pass cost, error widths), a request alone still takes what the
// planner predicted for it, within 1%, on either mover, and the rates are
// the fit's.
//
// With an fp8-e4m3 host tier whose calibration timed the decode kernel at
// a third of the preset's rate, the plan and the replay both price loads
// by the fitted kernel.
func TestReplayExecutesTheCalibratedPlan(t *testing.T) {
	for _, mover := range []string{MoverModel, MoverDevice} {
		t.Run(mover, func(t *testing.T) { replayTheCalibratedPlan(t, mover, "") })
		t.Run(mover+"-fp8", func(t *testing.T) { replayTheCalibratedPlan(t, mover, "fp8-e4m3") })
	}
}

// writeCalibrationWithDecode is writeCalibration's file with 40 launches
// of codec's decode kernel timed at rate bytes of KV a second.
func writeCalibrationWithDecode(t *testing.T, codec string, rate float64) string {
	t.Helper()
	path := writeCalibration(t)
	g, _ := cost.LookupGPU("h200")
	cal, err := cost.LoadCalibrationFile(path, g)
	if err != nil {
		t.Fatal(err)
	}
	cd, err := cost.LookupCodec(codec)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		b := int64(1+i%16) << 24
		if err := cal.AddCodecKernel(cd, false, b, time.Duration(float64(b)/rate*1e9)); err != nil {
			t.Fatal(err)
		}
	}
	if err := cal.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return path
}

func replayTheCalibratedPlan(t *testing.T, mover, codec string) {
	cfg := DefaultConfig()
	cfg.Baselines, cfg.Calibration, cfg.Mover = false, writeCalibration(t), mover
	if codec != "" {
		cd, _ := cost.LookupCodec(codec)
		cfg.HostCodec, cfg.NVMeCodec, cfg.Calibration = codec, codec, writeCalibrationWithDecode(t, codec, cd.DecodeBytesPerS/1)
		e := startedEngine(t, cfg)
		if got := e.codec.DecodeBytesPerS; !(got > cd.DecodeBytesPerS/1*0.97 && got < cd.DecodeBytesPerS/1*1.03) {
			t.Fatalf("the replay decodes at %.4g B/s, want the fitted %.4g", got, cd.DecodeBytesPerS/3)
		}
	}
	for _, blocks := range []int{1, 4, 32} {
		e := seedEngine(t, cfg, 1, blocks)
		if e.prefill.PassSeconds <= 0 {
			t.Fatalf("the calibration has no pass cost: %+v", e.prefill)
		}
		rd := trace.NewReader(strings.NewReader(requestLines(1, blocks)), trace.Options{Format: trace.FormatMooncake, Name: "one"})
		var plan kvtier.Estimate
		var shape string
		e.planned = func(r *request) { plan, shape = r.l1.Estimate(), planShape(r) }
		if err := e.run(rd); err != nil {
			t.Fatal(err)
		}
		ttft, loads := e.ttfts[0], strings.Count(shape, "l")
		t.Logf("%d host blocks: planned %v, replayed %v (%d loads, %d recomputes)", blocks, plan.Time, ttft, loads, strings.Count(shape, "r"))
		if plan.Time <= 0 || ttft < plan.Time-plan.Time/100 || ttft > plan.Time+plan.Time/100 {
			t.Errorf("%d blocks: replayed %v, planned %v", blocks, ttft, plan.Time)
		}
	}
	cfg.Calibration = filepath.Join(t.TempDir(), "missing.json")
	if _, err := newEngine(cfg, costplan.Cost); err == nil || !strings.Contains(err.Error(), "calibration") {
		t.Errorf("a missing calibration file: %v", err)
	}
}

// TestPlansSeeTheQueuedLoads: requests that arrive together, each on a GPU
// of its own (prefill slots 0), share the GPU's ingress: each one after
// the first plans behind the loads queued before it, and still ends when
// its plan said, within 1% in sum, on either mover. A pass waits for its
// first layer's loads, so a backlog delays a split plan whole: the later
// requests, behind most of a second of loads, recompute everything.
func plansSeeTheQueuedLoads(t *testing.T, mover string) {
	cfg := DefaultConfig()
	cfg.Baselines, cfg.PrefillSlots, cfg.GPU, cfg.Mover = false, 0, "b200", mover
	const requests, blocks = 10, 32
	lone := seedEngine(t, cfg, 1, blocks)
	if err := lone.run(trace.NewReader(strings.NewReader(requestLines(1, blocks)), trace.Options{Format: trace.FormatMooncake, Name: "one"})); err != nil {
		t.Fatal(err)
	}
	e := seedEngine(t, cfg, requests, blocks)
	if err := e.run(trace.NewReader(strings.NewReader(requestLines(requests, blocks)), trace.Options{Format: trace.FormatMooncake, Name: "four"})); err != nil {
		t.Fatal(err)
	}
	var ttfts time.Duration
	for _, d := range e.ttfts {
		ttfts += d
	}
	t.Logf("alone: %d recomputed; %d together: %d recomputed, planned %v s in all, replayed %v",
		lone.res.RecomputedBlocks, requests, e.res.RecomputedBlocks, e.res.PlannedTime.Seconds(), ttfts)
	if e.res.RecomputedBlocks <= requests*lone.res.RecomputedBlocks {
		t.Errorf("%d requests together recomputed %d blocks, %d alone each: the queue was not seen",
			requests, e.res.RecomputedBlocks, lone.res.RecomputedBlocks)
	}
	if p := time.Duration(e.res.PlannedTime.Seconds() * 1e9); ttfts < p-p/100 || ttfts > p+p/100 {
		t.Errorf("planned %v behind the queue, replayed %v", p, ttfts)
	}
	if e.res.PlanErrors != 0 {
		t.Errorf("%d plan errors", e.res.PlanErrors)
	}
}

// TestLongRequestPlanned: a request longer than the planner's scratch
// space is planned, not refused (no plan error): 70B at 64-token blocks,
// 5,000 blocks (320K tokens).
func TestLongRequestPlanned(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Model, cfg.TP, cfg.Baselines = "llama-3.1-70b", 8, false
	n := planScratchBlocks + 904
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(i + 1)
	}
	line := fmt.Sprintf(`{"arrival_us": 0, "input_tokens": %d, "output_tokens": 1, "block_tokens": 64, "keys": [%s]}`+"\n", n*64, strings.Join(ids, ","))
	src := Source{Name: "long", Format: trace.FormatNative, Open: stringSource("long", line).Open}
	rep := runOrFail(t, src, cfg)
	if r := rep.Results[0]; r.PlanErrors != 0 || r.Requests != 1 || r.Plan == nil {
		t.Errorf("a request of %d blocks: %+v", n, r)
	}
}

// startedEngine is the cost strategy's engine on cfg, started for the
// Mooncake traces' 512-token blocks.
func startedEngine(t *testing.T, cfg Config) *engine {
	t.Helper()
	e, err := newEngine(cfg, costplan.Cost)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.start(trace.MooncakeBlockTokens); err != nil {
		t.Fatal(err)
	}
	return e
}
