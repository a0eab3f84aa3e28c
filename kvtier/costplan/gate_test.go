package costplan

import (
	"errors"
	"strings"
	"testing"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
)

// fakeDrive is a drive with a set write rate and queue.
type fakeDrive struct {
	bps    float64
	queued int
}

func (d *fakeDrive) WriteBytesPerS() float64 { return d.bps }
func (d *fakeDrive) QueuedWrites() int       { return d.queued }

// modelOn is the 8B's cost model (16-token blocks) with its NVMe tier on
// a drive of the given read rate and latency.
func modelOn(t *testing.T, readBps float64, lat time.Duration) *cost.Planner {
	t.Helper()
	cfg, err := cost.NewPlannerConfig(cost.Presets{Model: "llama-3.1-8b", GPU: "h200", HostLink: "pcie5-pinned", NVMe: "nvme-gen4", BlockTokens: 16, MaxBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	drive := cost.Link{Name: "test-drive", BandwidthBytesPerS: readBps, Latency: lat}
	cfg.Paths[cost.TierNVMe] = cost.Path{Source: drive, Ingress: cfg.Paths[cost.TierHost].Ingress, Pipelined: true}
	p, err := cost.NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestGateWorth: a drive that loads a 2 MiB block slower than the GPU
// recomputes it anywhere in a 16K context is worth no write there (as the
// lent H200's disk is for the 8B's 16-token blocks; past 82K tokens the
// attention makes recompute dearer); a fast one is worth writing from the
// position where recompute grows past its load.
func TestGateWorth(t *testing.T) {
	slow, err := NewGate(GateConfig{Model: modelOn(t, 1.5e9, 200*time.Microsecond), Tier: cost.TierNVMe})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := slow.BreakEven(1024); ok {
		t.Errorf("a 1.5 GB/s drive breaks even at position %d of a 16K context", p)
	}
	if p, ok := slow.BreakEven(1 << 20); !ok || p < 1024 {
		t.Errorf("a 1.5 GB/s drive breaks even at %d, %v; want past a 16K context", p, ok)
	}
	if got := slow.AllowWrite(100, 2<<20); got != kvtier.NotWorth {
		t.Errorf("a write to the slow drive: %v, want not worth", got)
	}
	persist, _ := NewGate(GateConfig{Model: modelOn(t, 1.5e9, 200*time.Microsecond), Tier: cost.TierNVMe, Persist: true})
	if got := persist.AllowWrite(100, 2<<20); got != kvtier.Allowed {
		t.Errorf("a write with Persist: %v, want allowed", got)
	}
	fast, _ := NewGate(GateConfig{Model: modelOn(t, 50e9, 20*time.Microsecond), Tier: cost.TierNVMe})
	p, ok := fast.BreakEven(1 << 20)
	if !ok {
		t.Fatal("a 50 GB/s drive never breaks even")
	}
	if p > 0 && fast.Worth(p-1) || !fast.Worth(p) || !fast.Worth(p+100) {
		t.Errorf("break-even %d: worth(p-1) %v, worth(p) %v", p, fast.Worth(p-1), fast.Worth(p))
	}
}

// TestGateBudgetHoldsOverARun: writes offered far faster than the budget
// over a simulated minute get exactly the budget's bytes (its rate plus
// its depth), and a full queue refuses at once.
func TestGateBudgetHoldsOverARun(t *testing.T) {
	var now time.Duration
	d := &fakeDrive{bps: 100e6}
	const block = 2 << 20
	g, err := NewGate(GateConfig{Model: modelOn(t, 50e9, 20*time.Microsecond), Tier: cost.TierNVMe, Drive: d,
		WriteShare: 0.5, Persist: true, Now: func() time.Duration { return now }})
	if err != nil {
		t.Fatal(err)
	}
	written, refused := 0.0, 0
	for now = 0; now < time.Minute; now += time.Millisecond { // 1,000 blocks a second offered
		switch g.AllowWrite(10, block) {
		case kvtier.Allowed:
			written += block
		case kvtier.OverRate:
			refused++
		default:
			t.Fatal("unexpected refusal")
		}
	}
	budget := 0.5 * 100e6 * (60 + rateDepth)
	if written > budget || written < budget-2*block {
		t.Errorf("wrote %.0f bytes in a minute, budget %.0f", written, budget)
	}
	if refused == 0 {
		t.Error("nothing refused")
	}
	// 100 ms of the drive's 100 MB/s is 10 MB: 4 queued writes of 2 MiB
	// and this one take more.
	for queued, want := range map[int]kvtier.Refusal{3: kvtier.Allowed, 4: kvtier.QueueFull} {
		now += time.Hour // the rate budget full again
		d.queued = queued
		if got := g.AllowWrite(10, block); got != want {
			t.Errorf("with %d writes queued: %v, want %v", queued, got, want)
		}
	}
}

// TestGateEndurance: a drive of 1 TB at 0.864 drive writes a day may take
// 10 MB a second on average, whatever its rate.
func TestGateEndurance(t *testing.T) {
	var now time.Duration
	g, err := NewGate(GateConfig{Model: modelOn(t, 50e9, 20*time.Microsecond), Tier: cost.TierNVMe, Drive: &fakeDrive{bps: 10e9},
		WriteShare: 1, MaxQueueDelay: time.Hour, DriveWritesPerDay: 0.864, DriveBytes: 1e12, Persist: true, Now: func() time.Duration { return now }})
	if err != nil {
		t.Fatal(err)
	}
	written, over := 0.0, 0
	for now = 0; now < time.Hour; now += 10 * time.Millisecond {
		switch g.AllowWrite(10, 1<<20) {
		case kvtier.Allowed:
			written += 1 << 20
		case kvtier.OverEndurance:
			over++
		}
	}
	budget := 10e6 * (3600 + enduranceDepth)
	if written > budget || written < budget-2<<20 || over == 0 {
		t.Errorf("wrote %.0f bytes in an hour (%d refused), budget %.0f", written, over, budget)
	}
}

func TestGateConfigErrors(t *testing.T) {
	m := modelOn(t, 1e9, time.Millisecond)
	for field, cfg := range map[string]GateConfig{
		"Tier":              {Model: m, Tier: cost.TierGPU},
		"WriteBytesPerS":    {Model: m, Tier: cost.TierNVMe, WriteBytesPerS: -1},
		"WriteShare":        {Model: m, Tier: cost.TierNVMe, WriteShare: 1.5},
		"MaxQueueDelay":     {Model: m, Tier: cost.TierNVMe, MaxQueueDelay: -1},
		"DriveWritesPerDay": {Model: m, Tier: cost.TierNVMe, DriveWritesPerDay: -1},
		"DriveBytes":        {Model: m, Tier: cost.TierNVMe, DriveWritesPerDay: 1},
	} {
		_, err := NewGate(cfg)
		if !errors.Is(err, kvtier.ErrConfig) || !strings.Contains(err.Error(), "GateConfig."+field) {
			t.Errorf("%s: %v, want ErrConfig naming it", field, err)
		}
	}
}

// TestGateWithoutModel: with no cost model every write is worth it and
// the budgets alone refuse.
func TestGateWithoutModel(t *testing.T) {
	var now time.Duration
	g, err := NewGate(GateConfig{Tier: cost.TierNVMe, Drive: &fakeDrive{bps: 1e6}, WriteShare: 1,
		Now: func() time.Duration { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := g.BreakEven(100); !ok || p != 0 || !g.Worth(100) {
		t.Errorf("break-even %d, %v; worth %v: want every position worth a write", p, ok, g.Worth(100))
	}
	// A second's budget of a 1 MB/s drive: the first write of 1 MB is
	// taken, the next refused over the rate.
	if got := g.AllowWrite(0, 1e6); got != kvtier.Allowed {
		t.Errorf("the first write: %v", got)
	}
	if got := g.AllowWrite(0, 1e6); got != kvtier.OverRate {
		t.Errorf("the second write at once: %v, want over the rate", got)
	}
}
