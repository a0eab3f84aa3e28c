package replay

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/trace"
)

// replayEngine replays src under cfg and the cost strategy through the
// engine itself, so that a test can read what its device path counted.
func replayEngine(t *testing.T, src Source, cfg Config) *engine {
	t.Helper()
	e, err := newEngine(cfg, costplan.Cost)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := src.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if err := e.run(trace.NewReader(rc, trace.Options{Format: src.Format, Name: src.Name})); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestDeviceMoverReplaysTheBundledTrace: under Config.Mover "device" every
// copy between the GPU and the host tier of the bundled trace's replay goes
// through kvtier.DeviceMover and the transfer engine (their counts are the
// replay's), none fails, the device's clock leaves nothing in flight, and
// the report is close to the modelled channels' (the same trace, the same
// tiers, timed by the same link): the hit ratios and TTFT within a few
// percent.
func TestDeviceMoverReplaysTheBundledTrace(t *testing.T) {
	src, requests := bundled()
	cfg := testConfig()
	cfg.Baselines = false
	dev := replayEngine(t, src, cfg)
	cfg.Mover = MoverModel
	model := replayEngine(t, src, cfg)

	st, c := dev.devStats, &dev.res.copies
	if st.mover.Onboards == 0 || st.mover.Offloads == 0 {
		t.Fatalf("the DeviceMover moved %d onboards and %d offloads: the device path was not used", st.mover.Onboards, st.mover.Offloads)
	}
	// Loads from NVMe reach the GPU through it too, from staging slots.
	loads := c[kvtier.Host][kvtier.GPU] + c[kvtier.NVMe][kvtier.GPU]
	if st.mover.Onboards != uint64(loads) || st.mover.Offloads != uint64(c[kvtier.GPU][kvtier.Host]) {
		t.Errorf("the DeviceMover moved %d onboards and %d offloads, the replay counted %d (%d from NVMe) and %d",
			st.mover.Onboards, st.mover.Offloads, loads, c[kvtier.NVMe][kvtier.GPU], c[kvtier.GPU][kvtier.Host])
	}
	if st.mover.Failures != 0 || st.mover.NVMeReads+st.mover.NVMeWrites+st.mover.StagedLoads != 0 {
		t.Errorf("mover stats %+v: want no failure and no NVMe op (they take the modelled channels)", st.mover)
	}
	if want := int64(loads+c[kvtier.GPU][kvtier.Host]) * dev.blockBytes; st.engine.OnboardBytes+st.engine.OffloadBytes != want {
		t.Errorf("the engine moved %d + %d bytes, want %d", st.engine.OnboardBytes, st.engine.OffloadBytes, want)
	}
	if model.devStats.mover.Onboards != 0 {
		t.Error("the model mover's replay used the device path")
	}
	d, m := dev.result(), model.result()
	if d.Requests != requests || m.Requests != requests {
		t.Fatalf("replayed %d and %d requests, want %d", d.Requests, m.Requests, requests)
	}
	t.Logf("device: TTFT p50 %.4f s mean %.4f s, hit %.4f; model: p50 %.4f s mean %.4f s, hit %.4f; %d transfers",
		d.TTFT.P50, d.TTFT.Mean, d.HitRatio.Overall, m.TTFT.P50, m.TTFT.Mean, m.HitRatio.Overall, st.engine.Transfers)
	near := func(what string, a, b, tol float64) {
		if math.Abs(a-b) > tol*math.Abs(b) {
			t.Errorf("%s: device %.6g, model %.6g: more than %.0f%% apart", what, a, b, 100*tol)
		}
	}
	near("hit ratio", d.HitRatio.Overall, m.HitRatio.Overall, 0.01)
	near("TTFT p50", d.TTFT.P50, m.TTFT.P50, 0.05)
	near("TTFT mean", d.TTFT.Mean, m.TTFT.Mean, 0.05)
	near("TTFT p90", d.TTFT.P90, m.TTFT.P90, 0.05)
}

// TestDeviceMoverHostPoolInChunks: a host tier larger than one registration
// of the simulated device (it refuses 512 GiB, as the driver does) is
// registered in chunks of whole slots, with the staging slots after it,
// and the replay runs on it.
func TestDeviceMoverHostPoolInChunks(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Baselines, cfg.HostBytes, cfg.NVMeBytes = false, 1<<40, 0
	var lines strings.Builder
	for i := range 4 { // the same 8-block prompt four times, 1 s apart
		fmt.Fprintf(&lines, `{"timestamp": %d, "input_length": 4096, "output_length": 1, "hash_ids": [1,2,3,4,5,6,7,8]}`+"\n", 1000*i)
	}
	e := replayEngine(t, stringSource("four", lines.String()), cfg)
	if got := e.devStats.registrations; got != 5 {
		t.Errorf("1 TiB of host pool and 4 GiB of staging slots in %d registrations, want 5 (of 256 GiB at most)", got)
	}
	if got := e.devStats.mover.Offloads; got != 8 {
		t.Errorf("%d offloads through the DeviceMover, want the 8 blocks written through", got)
	}
	if e.res.copies[kvtier.GPU][kvtier.Host] != 8 {
		t.Errorf("%d copies to the host tier", e.res.copies[kvtier.GPU][kvtier.Host])
	}
}

// TestMoverConfigErrors: a mover that is not device or model is refused,
// naming the field, by Validate and by LoadConfig.
func TestMoverConfigErrors(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Mover = "dma"
	var ce *ConfigError
	if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != "mover" {
		t.Errorf("Validate of mover %q: %v", cfg.Mover, err)
	}
	if _, err := LoadConfig(strings.NewReader(`{"mover": ""}`)); !errors.As(err, &ce) || ce.Field != "mover" {
		t.Errorf("LoadConfig of an empty mover: %v", err)
	}
	if c, err := LoadConfig(strings.NewReader(`{"mover": "model"}`)); err != nil || c.Mover != MoverModel {
		t.Errorf("LoadConfig of the model mover: %+v, %v", c.Mover, err)
	}
}

// TestDevicePathRefusesABlockThatDoesNotSplit: the device lays blocks out
// layer by layer, so a block whose bytes do not split into the model's
// layers and parts is refused, naming the mover, and nothing is built.
func TestDevicePathRefusesABlockThatDoesNotSplit(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Mover, cfg.Baselines = MoverModel, false
	e, err := newEngine(cfg, costplan.Cost)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.start(trace.MooncakeBlockTokens); err != nil {
		t.Fatal(err)
	}
	e.model.Layers = 7 // 64 MiB is not 7 layers of K and V
	d, err := newDevicePath(e, 4)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "mover" || !strings.Contains(err.Error(), "7 layers") || d != nil {
		t.Fatalf("a block of %d bytes over 7 layers: %v, %v", e.blockBytes, d, err)
	}
}
