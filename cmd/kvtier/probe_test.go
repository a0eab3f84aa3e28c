package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/results"
)

func TestProbeNoGPU(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"probe", "--runs", "1", "--size", "64MiB"}, &out, &errb)
	if code == 0 {
		t.Skip("a GPU is present; the no-GPU path is not reachable here")
	}
	if code != 1 {
		t.Fatalf("exit code %d, want 1; stderr: %s", code, errb.String())
	}
	if msg := errb.String(); !strings.HasPrefix(msg, "kvtier probe: no CUDA driver/GPU found: ") || len(msg) < 50 {
		t.Fatalf("stderr %q does not say plainly that no driver/GPU was found and why", msg)
	}
}

func TestProbeBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--size", "lots"}, "--size"},
		{[]string{"--size", "0"}, "--size"},
		{[]string{"--size", "1024"}, "minimum"},
		{[]string{"--runs", "0"}, "--runs"},
		{[]string{"--device", "-2"}, "--device"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{"--nope"}, "nope"},
		{[]string{"--methods", "--remote", "127.0.0.1:1"}, "--methods do not apply"},
	} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"probe"}, c.args...), &out, &errb); code != 2 {
			t.Errorf("%v: exit code %d, want 2", c.args, code)
		}
		if !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: stderr %q does not mention %q", c.args, errb.String(), c.want)
		}
	}
}

func TestProbeJSONShape(t *testing.T) {
	res := probeResult{
		File: results.File{Benchmark: "probe", Machine: "h200", Date: "2026-11-29", Commit: "abc", Command: "kvtier probe --json x",
			Rows: []results.Row{{Name: "HtoD pinned 1GiB", Unit: "GiB/s", Median: 49.4, Min: 49, Max: 50, Runs: 5, Ratio: 1}}},
		Device:   probeDevice{Name: "NVIDIA H200", CC: "9.0", SMCount: 132, NUMANode: 0, PCIeGen: 5, PCIeWidth: 16, DriverVersion: 13000, BatchCopy: true},
		Measured: probeMeasured{H2DPinnedBytesPerS: 53e9, SmallCopyBytes: 16384, EventRoundtripSeconds: 3.2e-7},
	}
	path := filepath.Join(t.TempDir(), "probe-test.json")
	if err := probeWriteJSON(path, &res); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	keys := func(v any) []string {
		var k []string
		for key := range v.(map[string]any) {
			k = append(k, key)
		}
		slices.Sort(k)
		return k
	}
	if got, want := keys(m), []string{"benchmark", "command", "commit", "date", "device", "machine", "measured", "rows"}; !slices.Equal(got, want) {
		t.Errorf("top-level keys %v, want %v", got, want)
	}
	if got, want := keys(m["device"]), []string{"batch_copy", "cc", "copy_engines", "driver_version", "host_numa_alloc", "name", "numa_node", "pci_bus_id", "pcie_gen", "pcie_width", "sm_count", "total_mem_bytes"}; !slices.Equal(got, want) {
		t.Errorf("device keys %v, want %v", got, want)
	}
	if got, want := keys(m["measured"]), []string{"bidir_pinned_bytes_per_s", "d2h_pageable_bytes_per_s", "d2h_pinned_bytes_per_s", "event_roundtrip_seconds", "h2d_pageable_bytes_per_s", "h2d_pinned_bytes_per_s", "small_copy_bytes", "small_copy_bytes_per_s", "small_copy_issue_seconds"}; !slices.Equal(got, want) {
		t.Errorf("measured keys %v, want %v", got, want)
	}
	row := m["rows"].([]any)[0]
	if got, want := keys(row), []string{"baseline", "max", "median", "min", "name", "ratio", "runs", "unit"}; !slices.Equal(got, want) {
		t.Errorf("row keys %v, want %v", got, want)
	}
	var back probeResult
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if back.Device != res.Device || back.Measured != res.Measured || !slices.Equal(back.Rows, res.Rows) {
		t.Errorf("round trip changed the result:\n%+v\n%+v", back, res)
	}
	if err := probeWriteJSON(filepath.Join(t.TempDir(), "no", "such", "dir.json"), &res); err == nil || !strings.Contains(err.Error(), "--json") {
		t.Errorf("unwritable path: %v", err)
	}
}

func TestProbeCommandLine(t *testing.T) {
	cfg, err := probeParseFlags([]string{"--json", "out dir/p.json", "--machine", "h200", "--commit", "deadbeef"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if want := `kvtier probe --json "out dir/p.json" --machine h200 --commit deadbeef`; cfg.command != want {
		t.Errorf("command %q, want %q", cfg.command, want)
	}
	if cfg.machine != "h200" || cfg.commit != "deadbeef" || cfg.size != 1<<30 || cfg.runs != 5 {
		t.Errorf("config %+v", cfg)
	}
}

// TestProbeDeriveSwitches reads the switches off figures shaped like the
// H200's: the kernel wins one way at 16 KiB, batches from 64 KiB; beside
// batched offloads the kernel onboard wins to 64 KiB; gather/scatter beats
// every direct pair both ways from host runs of 1 MiB, and batches beat it
// from 2 MiB blocks.
func TestProbeDeriveSwitches(t *testing.T) {
	fig := map[string]float64{}
	put := func(bs int64, what, m string, run int64, v float64) { fig[probeMethodKey(bs, what, m, run)] = v }
	for _, bs := range probeMethodSizes {
		small := bs < 64<<10
		k, b := 46.0, 49.5
		if small {
			b = 21
		}
		put(bs, "HtoD", "kernel", 0, k)
		put(bs, "HtoD", "batch", 0, b)
		put(bs, "DtoH", "kernel", 0, k+1)
		put(bs, "DtoH", "batch", 0, b)
		put(bs, "both", "kernel+kernel", 0, 52)
		kb, bb := 70.0, 58.0
		if bs >= 256<<10 {
			bb = 83
		}
		put(bs, "both", "kernel+batch", 0, kb)
		put(bs, "both", "batch+batch", 0, bb)
		g := 91.0
		if bs >= 2<<20 {
			g = 82 // batches win there
		}
		put(bs, "both", "gather+gather", 0, g)
	}
	for _, run := range probeGatherRuns {
		v := 91.0
		if run < 1<<20 {
			v = 60
		}
		put(probeMethodSizes[0], "both", "gather+gather", run, v)
	}
	got := probeDeriveSwitches(fig)
	want := probeSwitches{KernelBelowBytes: 64 << 10, OnboardContendedKernelBelowBytes: 256 << 10, GatherMinRunBytes: 1 << 20, GatherPays: true, GatherBelowBytes: 2 << 20}
	if got != want {
		t.Errorf("switches %+v, want %+v", got, want)
	}
	// Where batches never win and gathering never pays.
	for k := range fig {
		if strings.Contains(k, "batch") || strings.Contains(k, "gather") {
			fig[k] = 1
		}
	}
	got = probeDeriveSwitches(fig)
	if got.KernelBelowBytes != 4<<20 || got.GatherPays {
		t.Errorf("batches and gathering never win: %+v, want the kernel below 4 MiB and no gathering", got)
	}
}

// TestProbeMethodsOnSim runs --methods' measurement on the simulated
// device (on synctest's fake clock): every case has a row and the
// switches come out.
func TestProbeMethodsOnSim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const total = 8 << 20
		sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 8*total + 16<<20, Link: cudastream.H200Link(), Clock: cudastream.SimWallClock})
		if err != nil {
			t.Fatal(err)
		}
		defer sim.Close()
		res := results.New("probe", "sim", "test")
		sw, err := probeMethods(sim, total, 1, res)
		if err != nil {
			t.Fatal(err)
		}
		// 4 sizes x 10 cases, plus 3 more gather runs at 16 KiB.
		if len(res.Rows) != 4*10+3 {
			t.Errorf("%d rows, want 43", len(res.Rows))
		}
		for _, r := range res.Rows {
			if r.Median <= 0 {
				t.Errorf("row %q: %v GiB/s", r.Name, r.Median)
			}
		}
		if sw.KernelBelowBytes == 0 || sw.OnboardContendedKernelBelowBytes == 0 {
			t.Errorf("switches %+v: some are missing", sw)
		}
		// A --size that holds 4 blocks of no size measured is refused
		// before anything is allocated.
		free, _, _ := sim.MemGetInfo()
		if _, err := probeMethods(sim, 48<<10, 1, res); err == nil || !strings.Contains(err.Error(), "--size 48KiB is not a multiple of 4 blocks") {
			t.Errorf("probeMethods with 48 KiB: %v, want the --size refused", err)
		}
		if after, _, _ := sim.MemGetInfo(); after != free {
			t.Errorf("a refused --size changed the device's free memory from %d to %d", free, after)
		}
	})
}
