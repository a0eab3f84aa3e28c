package cost

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// TestSeedTransferTable reproduces the seed chapter's table: 16 GB over each
// path at the chapter's bandwidths, latency 0, rounded to the millisecond.
func TestSeedTransferTable(t *testing.T) {
	const size = 16e9
	cases := []struct {
		preset string
		gbps   float64
		wantMS int64
	}{
		{"pcie4-pinned", 25, 640},
		{"nvlink-c2c-gh200", 450, 36},
		{"rdma-400g", 45, 356},
	}
	for _, c := range cases {
		l, err := LookupLink(c.preset)
		if err != nil {
			t.Fatal(err)
		}
		if l.BandwidthBytesPerS != c.gbps*1e9 {
			t.Errorf("%s: preset %g GB/s, seed %g", c.preset, l.BandwidthBytesPerS/1e9, c.gbps)
		}
		l.Latency = 0
		got := l.TransferTime(size)
		if ms := got.Round(time.Millisecond).Milliseconds(); ms != c.wantMS {
			t.Errorf("%s: 16 GB in %v, seed says %d ms", c.preset, got, c.wantMS)
		}
		p := DirectPath(l)
		if p.TransferTime(size) != got {
			t.Errorf("%s: path and link disagree", c.preset)
		}
	}
}

// TestPresetsAgreeWithProbe: the PCIe 5.0 presets are the H200's measured
// figures (within 2%), and no pageable preset is faster than the measured
// pageable rate or than its own generation's pinned one.
func TestPresetsAgreeWithProbe(t *testing.T) {
	p, err := LoadProbe("../../benchmarks/results/probe-h200.json")
	if err != nil {
		t.Fatal(err)
	}
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got/want-1) > 0.02 {
			t.Errorf("%s: preset %.4g, probe %.4g", name, got, want)
		}
	}
	pinned, _ := LookupLink("pcie5-pinned")
	near("pcie5-pinned bandwidth", pinned.BandwidthBytesPerS, p.Pinned.BandwidthBytesPerS)
	near("pcie5-pinned latency", pinned.Latency.Seconds(), p.Pinned.Latency.Seconds())
	pageable, _ := LookupLink("pcie5-pageable")
	near("pcie5-pageable bandwidth", pageable.BandwidthBytesPerS, p.Pageable.BandwidthBytesPerS)
	for _, gen := range []string{"pcie4", "pcie5", "pcie6"} {
		pg, _ := LookupLink(gen + "-pageable")
		pn, _ := LookupLink(gen + "-pinned")
		if pg.BandwidthBytesPerS > pageable.BandwidthBytesPerS*1.02 || pg.BandwidthBytesPerS >= pn.BandwidthBytesPerS {
			t.Errorf("%s: %g GB/s, above the measured pageable %g or its pinned %g", pg.Name, pg.BandwidthBytesPerS/1e9, pageable.BandwidthBytesPerS/1e9, pn.BandwidthBytesPerS/1e9)
		}
		if pg.Source == "" || pn.Source == "" {
			t.Errorf("%s: a preset without its source", gen)
		}
	}
}

func TestPathPipelinedAndSerial(t *testing.T) {
	nvme := Link{Name: "nvme", BandwidthBytesPerS: 10e9, Latency: 100 * time.Microsecond}
	pcie := Link{Name: "pcie", BandwidthBytesPerS: 50e9, Latency: 10 * time.Microsecond}
	p := Path{Source: nvme, Ingress: pcie, Pipelined: true}
	if got, want := p.TransferTime(10e9), time.Second+110*time.Microsecond; got != want {
		t.Errorf("pipelined: %v, want %v (slower stage dominates)", got, want)
	}
	p.Pipelined = false
	if got, want := p.TransferTime(10e9), 1200*time.Millisecond+110*time.Microsecond; got != want {
		t.Errorf("serial: %v, want %v", got, want)
	}
	if p.TransferTime(0) != 0 {
		t.Error("zero bytes must cost nothing")
	}
	if p.Name() != "nvme then pcie" {
		t.Errorf("name %q", p.Name())
	}
}

func TestDrives(t *testing.T) {
	one, _ := LookupLink("nvme-gen5")
	four, err := LookupLink("nvme-gen5-x4")
	if err != nil {
		t.Fatal(err)
	}
	if four.BandwidthBytesPerS != 4*one.BandwidthBytesPerS || four.Latency != one.Latency {
		t.Fatalf("x4: %+v", four)
	}
	for _, bad := range []string{"nvme-gen5-x0", "nvme-gen5-x", "nvme-gen5-x4a", "nvme-gen9-x2", "nvme-gen5-x100"} {
		if _, err := LookupLink(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestLinkValidate(t *testing.T) {
	for _, l := range []Link{
		{BandwidthBytesPerS: 0},
		{BandwidthBytesPerS: -1},
		{BandwidthBytesPerS: math.NaN()},
		{BandwidthBytesPerS: 1e15},
		{BandwidthBytesPerS: 1e9, Latency: -1},
		{BandwidthBytesPerS: 1e9, Latency: time.Hour},
		{BandwidthBytesPerS: 1e9, DescriptorCost: -1},
		{BandwidthBytesPerS: 1e9, EventCost: time.Hour},
	} {
		var fe *FieldError
		if err := l.Validate(); !errors.As(err, &fe) {
			t.Errorf("%+v: %v", l, err)
		}
	}
	// The issue costs are named, and a planner refuses a path with one.
	bad := Link{Name: "x", BandwidthBytesPerS: 1e9, DescriptorCost: -time.Microsecond}
	var fe *FieldError
	if err := bad.Validate(); !errors.As(err, &fe) || fe.Field != "descriptor_cost" {
		t.Errorf("negative descriptor cost: %v", err)
	}
	bad = Link{Name: "x", BandwidthBytesPerS: 1e9, EventCost: -time.Microsecond}
	if err := bad.Validate(); !errors.As(err, &fe) || fe.Field != "event_cost" {
		t.Errorf("negative event cost: %v", err)
	}
	m, _ := LookupModel("llama-3.1-8b")
	h200, _ := LookupGPU("h200")
	cfg := PlannerConfig{Model: m, GPU: h200, TP: 1, BlockTokens: 16}
	cfg.Paths[TierHost] = DirectPath(bad)
	if _, err := NewPlanner(cfg); err == nil || !strings.Contains(err.Error(), "event_cost") {
		t.Errorf("a planner over a link with a negative event cost: %v", err)
	}
	for _, name := range LinkNames() {
		l, _ := LookupLink(name)
		if err := l.Validate(); err != nil || l.Source == "" {
			t.Errorf("%s: %v (source %q)", name, err, l.Source)
		}
	}
	for _, name := range GPUNames() {
		g, _ := LookupGPU(name)
		if err := g.Validate(); err != nil || g.Source == "" {
			t.Errorf("%s: %v", name, err)
		}
	}
	g := GPU{PeakFLOPS: 1e15, Efficiency: 1.5}
	if err := g.Validate(); !errors.As(err, &fe) || fe.Field != "efficiency" {
		t.Errorf("efficiency 1.5: %v", err)
	}
	g = GPU{PeakFLOPS: 0, Efficiency: 0.5}
	if err := g.Validate(); !errors.As(err, &fe) || fe.Field != "tflops" {
		t.Errorf("tflops 0: %v", err)
	}
}
