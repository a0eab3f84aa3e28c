package replay

import (
	"fmt"
	"testing"

	"kvtier.dev/kvtier/trace"
)

// TestLoadSlowdownNeverWorse: a lower tier never makes serving worse on a
// GPU whose passes end later while loads copy (a calibration's load
// slowdown of 0.2): the cost strategy serves generated chat and agentic
// traces (35-45% of the GPU's prefill capacity) with TTFT p50 and mean no
// worse than the GPU-only prefix cache's, with a host tier twice the
// GPU's, the same over a slow drive (whose reads lose to recompute), and a
// large host tier. Host loads win by far more than the slowdown costs here;
// TestPlanPricesLoadSlowdown and TestReplayExecutesThePlan hold the
// Planner and the replay to the term itself. In quick mode, 40 chat
// requests over the slow drive only.
func TestLoadSlowdownNeverWorse(t *testing.T) {
	chat := trace.DefaultGenConfig()
	chat.Requests, chat.BlockTokens, chat.MaxContextTokens, chat.SessionsPerSecond = 200, 16, 8192, 2
	chat.SystemPromptTokens, chat.MeanThinkTime = [2]int{1000, 6000}, 10e9
	agentic := trace.AgenticGenConfig()
	agentic.Requests, agentic.BlockTokens, agentic.MaxContextTokens, agentic.SessionsPerSecond = 200, 16, 8192, 1
	agentic.SystemPromptTokens = [2]int{2000, 4000}
	slow := writeDriveFile(t, 1.2, 1.6)
	tiers := []struct {
		name       string
		host, nvme Bytes
		drive      string
	}{{"host 4GiB", 4 << 30, 0, ""}, {"host 4GiB, slow drive", 4 << 30, 32 << 30, slow}, {"host 32GiB", 32 << 30, 0, ""}}
	traces := []struct {
		name string
		gen  trace.GenConfig
	}{{"chat", chat}, {"agentic", agentic}}
	if quick { // the block manager checks its whole state on almost every operation
		chat.Requests, traces, tiers = 40, traces[:1], tiers[1:2]
		traces[0].gen = chat
	}
	for _, tr := range traces {
		for _, tc := range tiers {
			t.Run(fmt.Sprintf("%s/%s", tr.name, tc.name), func(t *testing.T) {
				run := func(strategy string) *StrategyResult {
					cfg := DefaultConfig()
					cfg.GPU, cfg.Calibration = "h200", slowdownCalibration(t, "h200", 0.2)
					cfg.GPUBytes, cfg.HostBytes, cfg.NVMeBytes = 2<<30, tc.host, tc.nvme
					cfg.MaxOutputTokens, cfg.Strategy, cfg.Baselines = 16, strategy, false
					if tc.drive != "" {
						cfg.NVMeLink = tc.drive
					}
					rep := runOrFail(t, GeneratedSource(tr.name, tr.gen), cfg)
					return &rep.Results[0]
				}
				cost, gpuOnly := run("cost"), run("gpu-only")
				t.Logf("offered load %.2f; cost TTFT p50 %.4f mean %.4f (loads %d host, %d NVMe); gpu-only p50 %.4f mean %.4f", gpuOnly.OfferedPrefillLoad,
					cost.TTFT.P50, cost.TTFT.Mean, cost.Loads.FromHost, cost.Loads.FromNVMe, gpuOnly.TTFT.P50, gpuOnly.TTFT.Mean)
				if cost.Strategy != "cost" || gpuOnly.Strategy != "gpu-only" {
					t.Fatalf("replayed %s and %s", cost.Strategy, gpuOnly.Strategy)
				}
				if cost.TTFT.Mean > gpuOnly.TTFT.Mean || cost.TTFT.P50 > gpuOnly.TTFT.P50 {
					t.Errorf("cost TTFT p50 %.4f s, mean %.4f s; gpu-only %.4f s, %.4f s", cost.TTFT.P50, cost.TTFT.Mean, gpuOnly.TTFT.P50, gpuOnly.TTFT.Mean)
				}
			})
		}
	}
}
