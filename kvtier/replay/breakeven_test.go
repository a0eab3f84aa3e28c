package replay

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"kvtier.dev/kvtier/trace"
)

// TestReportBreakEven: the report gives each lower tier's break-even
// without and with compression: over the H200's drive (nvme-gen4) the FP8
// preset halves the bytes a token costs, so a shorter prompt already
// reloads faster than it recomputes; with the tiers holding FP8 blocks,
// the "with" column prices their codec. A GPU-only replay has no line.
// (That FP8 replay, whose first request arrives at 0, failed before: the
// device's start-up work, the codec ring's probe, had moved its clock to
// 20 us; devicePath.upAt.)
func TestReportBreakEven(t *testing.T) {
	reqs := []trace.Request{{Arrival: 0, BlockTokens: 16, InputTokens: 64, OutputTokens: 1, Keys: keysFrom(1, 4)},
		{Arrival: time.Second, BlockTokens: 16, InputTokens: 64, OutputTokens: 1, Keys: keysFrom(1, 4)}}
	cfg := DefaultConfig()
	cfg.Baselines, cfg.NVMeLink = false, "nvme-gen4"
	rep := runOrFail(t, linesSource("kv", reqs...), cfg)
	if len(rep.BreakEven) != 2 || rep.BreakEven[0].Tier != "host" || rep.BreakEven[1].Tier != "nvme" {
		t.Fatalf("break-evens %+v, want the host's and the NVMe tier's", rep.BreakEven)
	}
	nv := rep.BreakEven[1]
	if nv.Codec != "fp8-e4m3" || nv.WithoutTokens == 0 || nv.WithTokens == 0 || nv.WithTokens >= nv.WithoutTokens ||
		nv.WithLinearTokens >= nv.WithoutLinearTokens {
		t.Errorf("the NVMe tier's break-even %+v: want fp8-e4m3's below bf16's", nv)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "reload beats recompute from") || !strings.Contains(b.String(), "with fp8-e4m3:") {
		t.Errorf("the text report lacks the break-evens:\n%s", b.String())
	}
	j, err := json.Marshal(rep)
	if err != nil || !strings.Contains(string(j), `"break_even":[{"tier":"host"`) {
		t.Errorf("the JSON report lacks break_even (%v)", err)
	}

	cfg.HostCodec, cfg.NVMeCodec = "fp8-e4m3", "fp8-e4m3"
	if got := runOrFail(t, linesSource("kv", reqs...), cfg).BreakEven; len(got) != 2 || got[1] != nv {
		t.Errorf("with the tiers in FP8: %+v, want the same columns as before (%+v)", got, nv)
	}
	cfg.HostCodec, cfg.NVMeCodec, cfg.HostBytes, cfg.NVMeBytes = "", "", 0, 0
	if got := runOrFail(t, linesSource("kv", reqs...), cfg).BreakEven; len(got) != 0 {
		t.Errorf("a GPU-only replay: break-evens %+v, want none", got)
	}
}
