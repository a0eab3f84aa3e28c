package cost

import (
	"math"
	"testing"
	"time"
)

// passPlanner plans llama-3.1-8b on the H200 in 16-token blocks (2 MiB)
// over a 50 GB/s ingress (3 us a call, the H200's issue costs) and an NVMe
// drive of driveBytesPerS (80 us).
func passPlanner(t *testing.T, driveBytesPerS float64) *Planner {
	t.Helper()
	m, _ := LookupModel("llama-3.1-8b")
	g, _ := LookupGPU("h200")
	in := Link{Name: "in", BandwidthBytesPerS: 50e9, Latency: 3 * time.Microsecond,
		DescriptorCost: 500 * time.Nanosecond, EventCost: 320 * time.Nanosecond}
	drive := Link{Name: "drive", BandwidthBytesPerS: driveBytesPerS, Latency: 80 * time.Microsecond}
	cfg := PlannerConfig{Model: m, GPU: g, TP: 1, BlockTokens: 16}
	cfg.Paths[TierHost] = DirectPath(in)
	cfg.Paths[TierNVMe] = Path{Source: drive, Ingress: in, Pipelined: true}
	p, err := NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPassLoadsByHand: the layers of a pass's loads land where the copy
// engine's onboards put them, worked by hand for 4 host blocks and 2 NVMe
// blocks of llama-3.1-8b (32 layers, 2 MiB blocks of 16 tokens), the
// ingress 1 ms and the drive 2 ms busy. The host onboard's layers take
// 3 us (the call) + 4 × (0.5 us + 2 MiB/32 at 50 GB/s) + 0.32 us each from
// 1 ms; the drive reads the NVMe blocks (80 us, then 2 MiB at 5 GB/s each,
// 419 us) from 2 ms, after the host onboard, and a one-block onboard
// (164 us) is shorter than a read: each goes alone as it is read, and the
// last one's layers land last.
func TestPassLoadsByHand(t *testing.T) {
	p := passPlanner(t, 5e9)
	const block = 2 << 20
	layer := func(k int) float64 { return 3e-6 + float64(k)*(0.5e-6+block/50e9/32) + 0.32e-6 }
	last := 2e-3 + 80e-6 + 2*block/5e9
	want := func(l int) float64 {
		return max(1e-3+float64(l+1)*layer(4), last+float64(l+1)*layer(1))
	}
	pl := p.PassLoads([NumTiers]int{TierHost: 4, TierNVMe: 2}, Backlog{Link: time.Millisecond, Drive: 2 * time.Millisecond})
	for _, l := range []int{0, 1, 15, 31} {
		if got := pl.LayerLanded(l).Seconds(); math.Abs(got-want(l)) > 1e-9 {
			t.Errorf("layer %d landed at %.9f s, want %.9f", l, got, want(l))
		}
	}
	if got, w := pl.Landed().Seconds(), want(31); math.Abs(got-w) > 1e-9 {
		t.Errorf("landed %.9f s, want %.9f", got, w)
	}
	ingress := last + 32*layer(1)
	if got := pl.IngressEnd().Seconds(); math.Abs(got-ingress) > 1e-9 || pl.Layers() != 32 {
		t.Errorf("ingress free at %.9f s, want %.9f; %d layers", got, ingress, pl.Layers())
	}
	none := p.PassLoads([NumTiers]int{}, Backlog{Link: time.Millisecond})
	if none.Landed() != 0 || none.IngressEnd() != time.Millisecond {
		t.Errorf("no loads: landed %v, ingress free at %v", none.Landed(), none.IngressEnd())
	}
}

// TestStagedOnboardsByHand: a drive faster than the ingress (100 GB/s
// against 50) reads 3 NVMe blocks of 2 MiB in 21 us each after its 80 us:
// the first goes alone from 101 us, and the two read while it copies
// (164 us) go together when it is done, so their layers land at its end
// plus l+1 layers of a two-block onboard.
func TestStagedOnboardsByHand(t *testing.T) {
	p := passPlanner(t, 100e9)
	const block = 2 << 20
	layer := func(k int) float64 { return 3e-6 + float64(k)*(0.5e-6+block/50e9/32) + 0.32e-6 }
	firstRead := 80e-6 + block/100e9
	second := firstRead + 32*layer(1) // the first onboard is done
	pl := p.PassLoads([NumTiers]int{TierNVMe: 3}, Backlog{})
	for _, l := range []int{0, 7, 31} {
		if got, want := pl.LayerLanded(l).Seconds(), second+float64(l+1)*layer(2); math.Abs(got-want) > 1e-9 {
			t.Errorf("layer %d landed at %.9f s, want %.9f", l, got, want)
		}
	}
	if got, want := pl.IngressEnd().Seconds(), second+32*layer(2); math.Abs(got-want) > 1e-9 {
		t.Errorf("ingress free at %.9f s, want %.9f", got, want)
	}
}

// TestPassOverlapsLoadsAndCompute: a prefix loaded from the host tier and
// recomputed in its head ends a pass later than the longer of its loads
// and its compute by one layer of the shorter: the pass computes layer l
// once layer l of the loads has landed.
func TestPassOverlapsLoadsAndCompute(t *testing.T) {
	p := longPlanner(t)
	blocks := tierBlocks(TierHost, 256)
	actions := make([]Action, len(blocks))
	for i := range actions {
		actions[i] = ActionLoad
		if i < 32 {
			actions[i] = ActionRecompute
		}
	}
	got, err := p.Simulate(blocks, actions)
	if err != nil {
		t.Fatal(err)
	}
	c := p.costs.Load()
	pl := p.PassLoads([NumTiers]int{TierHost: 224}, Backlog{})
	u := pl.LayerLanded(0).Seconds()
	compute := 0.0
	for i := range 32 {
		compute += c.prefill.MarginalSeconds(16, 16*i)
	}
	work := max(c.prefill.FloorSeconds, compute)
	want := max(u+work, 32*u+work/32)
	if math.Abs(got.Seconds()-want) > 1e-9 {
		t.Errorf("pass %v, want %.9f s (layers of %.6f s loading, %.6f s computing)", got, want, u, work/32)
	}
	if loads := pl.Landed().Seconds(); got.Seconds() <= max(loads, work) {
		t.Errorf("pass %v: no longer than its loads %.6f s or its compute %.6f s", got, loads, work)
	}
}
