package cost

import (
	"math"
	"testing"
	"time"
)

// codecPlanners are two planners of llama-3.1-8b (16-token blocks) on the
// H200 with no pass floor whose NVMe tier sits behind drive and
// pcie5-pinned, one holding raw blocks and one fp8-e4m3 blocks.
func codecPlanners(t *testing.T, drive Link) (raw, enc *Planner) {
	t.Helper()
	pcie, err := LookupLink("pcie5-pinned")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testCodecPlannerConfig(t, Path{Source: drive, Ingress: pcie, Pipelined: true})
	if raw, err = NewPlanner(cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Paths[TierNVMe].Codec = fp8(t)
	if enc, err = NewPlanner(cfg); err != nil {
		t.Fatal(err)
	}
	return raw, enc
}

func tierBlocks(tier Tier, n int) []BlockSource {
	b := make([]BlockSource, n)
	for i := range b {
		b[i].Tier = tier
	}
	return b
}

// TestPlanCodecBlockLoadCost: a compressed block's load is its path's
// latency, the last chunk's decode and the slower of its encoded copy and
// its decode; the host tier, without a codec, is unchanged.
func TestPlanCodecBlockLoadCost(t *testing.T) {
	raw, enc := codecPlanners(t, Link{Name: "drive", BandwidthBytesPerS: 3.5e9, Latency: 80 * time.Microsecond})
	want := 82.1e-6 + float64(2048+1048576)/3.5e9 + 8*2097152/1.12e12
	if got := enc.BlockLoadCost(TierNVMe).Seconds(); math.Abs(got-want) > 1e-9 {
		t.Errorf("compressed NVMe block %g s, want %g", got, want)
	}
	want = 82.1e-6 + 2097152/3.5e9
	if got := raw.BlockLoadCost(TierNVMe).Seconds(); math.Abs(got-want) > 1e-9 {
		t.Errorf("raw NVMe block %g s, want %g", got, want)
	}
	if a, b := raw.BlockLoadCost(TierHost), enc.BlockLoadCost(TierHost); a != b {
		t.Errorf("host tier without a codec: %v and %v", a, b)
	}
}

// TestPlanCodecSlowDrive: over a 3.5 GB/s drive (a PCIe 3.0 x4 NVMe's
// sequential read), recomputing a 16-token block of llama-3.1-8b on the
// H200 beats loading it raw, but loading it compressed beats recomputing.
// In a pass the drive reads every block it loads before the first layer
// lands, so a 64-block prefix on it is recomputed whole raw, and loaded
// whole, sooner, compressed. Over a 1.2 GB/s drive neither load pays.
func TestPlanCodecSlowDrive(t *testing.T) {
	raw, enc := codecPlanners(t, Link{Name: "drive", BandwidthBytesPerS: 3.5e9, Latency: 80 * time.Microsecond})
	rec := raw.BlockRecomputeCost(0)
	if lr, le := raw.BlockLoadCost(TierNVMe), enc.BlockLoadCost(TierNVMe); !(le < rec && rec < lr) {
		t.Fatalf("3.5 GB/s: load raw %v, compressed %v, recompute %v: want compressed < recompute < raw", lr, le, rec)
	}
	blocks := tierBlocks(TierNVMe, 64)
	rr, _ := checkPlan(t, raw, blocks)
	re, _ := checkPlan(t, enc, blocks)
	t.Logf("3.5 GB/s, 64 blocks: raw %v (%d loaded), compressed %v (%d loaded), recompute all %v",
		rr.Time, rr.LoadBlocks, re.Time, re.LoadBlocks, rr.RecomputeAllTime)
	if rr.LoadBlocks != 0 || re.LoadBlocks != 64 || re.Time >= rr.Time {
		t.Errorf("3.5 GB/s, 64 blocks: raw %+v, compressed %+v", rr, re)
	}

	raw, enc = codecPlanners(t, Link{Name: "drive", BandwidthBytesPerS: 1.2e9, Latency: 80 * time.Microsecond})
	rr, _ = checkPlan(t, raw, blocks)
	re, _ = checkPlan(t, enc, blocks)
	if rr.LoadBlocks != 0 || re.LoadBlocks != 0 {
		t.Errorf("1.2 GB/s, 64 blocks: raw %+v, compressed %+v, want both recomputed", rr, re)
	}
}

// TestPlanCodecFastLink: over NVLink-C2C (450 GB/s) a block of
// llama-3.1-8b loads in about a hundredth of its recompute either way, so
// a 64-block prefix loads nearly every block, compressed or not (the pass
// recomputes a few head blocks while the first layers land). What the
// codec saves is the raw onboard's issue, layer by layer (a descriptor per
// block and layer, a call and an event per layer), where the codec path
// issues a chunk of whole blocks at a time, and under 1% of what
// recomputing the prefix would cost besides.
func TestPlanCodecFastLink(t *testing.T) {
	c2c, err := LookupLink("nvlink-c2c-gh200")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testCodecPlannerConfig(t, DirectPath(c2c))
	plans := [2]PlanResult{}
	for i, codec := range []Codec{{}, fp8(t)} {
		cfg.Paths[TierHost].Codec = codec
		p, err := NewPlanner(cfg)
		if err != nil {
			t.Fatal(err)
		}
		plans[i], _ = checkPlan(t, p, tierBlocks(TierHost, 64))
		if plans[i].LoadBlocks < 60 {
			t.Errorf("codec %q: %+v, want at least 60 of 64 loaded", codec.Name, plans[i])
		}
	}
	issue := time.Duration(cfg.Model.Layers) * (c2c.Latency + c2c.EventCost + time.Duration(plans[0].LoadBlocks)*c2c.DescriptorCost)
	t.Logf("raw %v, compressed %v, recompute all %v, raw issue %v", plans[0].Time, plans[1].Time, plans[0].RecomputeAllTime, issue)
	if saved := plans[0].Time - plans[1].Time; saved < 0 || saved > issue+plans[0].RecomputeAllTime/100 {
		t.Errorf("compression saves %v of %v (recompute all %v), want between 0 and the raw issue %v + 1%% of recompute all",
			saved, plans[0].Time, plans[0].RecomputeAllTime, issue)
	}
}
