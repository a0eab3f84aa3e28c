package cost

import (
	"math"
	"testing"
	"time"
)

// TestPassLoadsByHand: the layers of a pass's loads land where the copy
// engine's onboards put them, worked by hand for 4 host blocks and 2 NVMe
// blocks of llama-3.1-8b (32 layers, 2 MiB blocks of 16 tokens), the
// ingress 1 ms and the drive 2 ms busy. The host onboard's layers take
// 3 us (the call) + 4 × (0.5 us + 2 MiB/32 at 50 GB/s) + 0.32 us each from
// 1 ms; the drive reads the NVMe blocks (80 us, then 2 MiB at 5 GB/s each)
// from 2 ms, and their layers land no sooner than the last read plus a
// one-block onboard's layers, nor than a two-block onboard's after the
// first read and the host onboard.
func TestPassLoadsByHand(t *testing.T) {
	m, _ := LookupModel("llama-3.1-8b")
	g, _ := LookupGPU("h200")
	in := Link{Name: "in", BandwidthBytesPerS: 50e9, Latency: 3 * time.Microsecond,
		DescriptorCost: 500 * time.Nanosecond, EventCost: 320 * time.Nanosecond}
	drive := Link{Name: "drive", BandwidthBytesPerS: 5e9, Latency: 80 * time.Microsecond}
	cfg := PlannerConfig{Model: m, GPU: g, TP: 1, BlockTokens: 16}
	cfg.Paths[TierHost] = DirectPath(in)
	cfg.Paths[TierNVMe] = Path{Source: drive, Ingress: in, Pipelined: true}
	p, err := NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const block = 2 << 20
	layer := func(k int) float64 { return 3e-6 + float64(k)*(0.5e-6+block/50e9/32) + 0.32e-6 }
	hostEnd := 1e-3 + 32*layer(4)
	read := block / 5e9
	first, last := 2e-3+80e-6+read, 2e-3+80e-6+2*read
	want := func(l int) float64 {
		host := 1e-3 + float64(l+1)*layer(4)
		nvme := max(last+float64(l+1)*layer(1), max(hostEnd, first)+float64(l+1)*layer(2))
		return max(host, nvme)
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
	ingress := max(last+32*layer(1), max(hostEnd, first)+32*layer(2))
	if got := pl.IngressEnd().Seconds(); math.Abs(got-ingress) > 1e-9 || pl.Layers() != 32 {
		t.Errorf("ingress free at %.9f s, want %.9f; %d layers", got, ingress, pl.Layers())
	}
	none := p.PassLoads([NumTiers]int{}, Backlog{Link: time.Millisecond})
	if none.Landed() != 0 || none.IngressEnd() != time.Millisecond {
		t.Errorf("no loads: landed %v, ingress free at %v", none.Landed(), none.IngressEnd())
	}
}

// TestPassOverlapsLoadsAndCompute: a prefix loaded from the host tier and
// recomputed in its head ends a pass later than the longer of its loads
// and its compute by one layer of the shorter: the pass computes layer l
// once layer l of the loads has landed.
func TestPassOverlapsLoadsAndCompute(t *testing.T) {
	p := longPlanner(t)
	blocks := make([]BlockSource, 256)
	for i := range blocks {
		blocks[i].Tier = TierHost
	}
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
