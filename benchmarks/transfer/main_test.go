package main

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/transfer"
)

// TestBothWaysOnSim runs the "both" rows of the benchmark on the simulated
// device (wall clock faked by synctest, so the onboard is certainly still in
// flight when the offload is submitted) with 1 MiB per transfer, and checks
// that the rows are there and that engine-auto made MethodAuto's contended
// choices, which the notes report.
func TestBothWaysOnSim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := simBench(t)
		res := results.New("transfer", "sim", "test")
		for _, bs := range []int64{16 << 10, 64 << 10, 256 << 10} {
			if err := b.size(res, bs, 1, transfer.Config{}, []direction{both}); err != nil {
				t.Fatalf("block size %d: %v", bs, err)
			}
		}
		// The counts in parentheses depend on how many random blocks
		// happened to be adjacent and coalesced: compare without them.
		counts := regexp.MustCompile(` \([0-9]+ of [0-9]+ descriptors\)|, submitted in [0-9.]+ ms`)
		// With a device staging ring, auto gathers: the benchmark's host
		// slots are contiguous, so each chunk crosses the link as one DMA.
		ring := results.New("transfer", "sim", "test")
		if err := b.size(ring, 16<<10, 1, transfer.Config{GatherBuffers: 2, GatherBufferBytes: 256 << 10}, []direction{both}); err != nil {
			t.Fatalf("with a ring: %v", err)
		}
		for _, want := range []string{
			"both 16KiB engine-auto chose (last round): onboard by gather/scatter (4 chunks, 4 DMAs), offload by gather/scatter (4 chunks, 4 DMAs)",
			"both 16KiB engine-auto-concurrent chose (last round): onboard by gather/scatter (4 chunks, 4 DMAs), offload by gather/scatter (4 chunks, 4 DMAs)",
			"engine-gather: 1MiB of device staging",
			"engine-kernel: 0B of device staging",
		} {
			if !slices.ContainsFunc(ring.Notes, func(n string) bool { return counts.ReplaceAllString(n, "") == want }) {
				t.Errorf("no note %q in:\n%s", want, strings.Join(ring.Notes, "\n"))
			}
		}
		if !slices.ContainsFunc(ring.Rows, func(r results.Row) bool { return r.Name == "both 16KiB engine-gather vs large copy" }) {
			t.Error("no engine-gather row with a ring")
		}
		// Serving-shaped blocks (here 4 layers x 2 parts of 8 KiB): the
		// onboard goes layer by layer, each layer's pieces strided on the
		// host, and still crosses the link as strided copies.
		b.layers, b.parts = 4, 2
		serving := results.New("transfer", "sim", "test")
		if err := b.size(serving, 64<<10, 1, transfer.Config{GatherBuffers: 2, GatherBufferBytes: 256 << 10, GatherMinRunBytes: 128 << 10}, []direction{htod}); err != nil {
			t.Fatalf("serving blocks: %v", err)
		}
		if want := "HtoD 64KiB engine-auto chose (last round): onboard by gather/scatter (4 chunks, 4 DMAs)"; !slices.ContainsFunc(serving.Notes, func(n string) bool { return counts.ReplaceAllString(n, "") == want }) {
			t.Errorf("no note %q in:\n%s", want, strings.Join(serving.Notes, "\n"))
		}
		var notes []string
		for _, n := range res.Notes {
			notes = append(notes, counts.ReplaceAllString(n, ""))
		}
		for _, want := range []string{
			// The onboard goes first, into an idle link: the one-way
			// switch (64 KiB) sends 16 KiB blocks to the kernel and larger
			// ones to batches; the offload then takes the one-way switch
			// too. Offload first: an onboard beside it takes the kernel
			// below 256 KiB.
			"both 16KiB engine-auto chose (last round): onboard by the copy kernel, offload by the copy kernel",
			"both 64KiB engine-auto chose (last round): onboard by batches, offload by batches",
			"both 256KiB engine-auto chose (last round): onboard by batches, offload by batches",
			"both 64KiB engine-auto-offload-first chose (last round): onboard by the copy kernel, offload by batches",
			"both 256KiB engine-auto-offload-first chose (last round): onboard by batches, offload by batches",
		} {
			if !slices.Contains(notes, want) {
				t.Errorf("no note %q in:\n%s", want, strings.Join(notes, "\n"))
			}
		}
		for _, want := range []string{
			"both 64KiB per-block loop",
			"both 64KiB one large copy",
			"both 64KiB engine-auto vs large copy",
			"both 64KiB engine-batch-onboard+kernel-offload vs loop",
			"both 64KiB engine-auto-offload-first vs large copy",
		} {
			if !slices.ContainsFunc(res.Rows, func(r results.Row) bool { return r.Name == want }) {
				t.Errorf("no row %q", want)
			}
		}
	})
}

func TestParseDirs(t *testing.T) {
	got, err := parseDirs("both, htod")
	if err != nil || !slices.Equal(got, []direction{both, htod}) {
		t.Errorf("parseDirs(both, htod) = %v, %v", got, err)
	}
	if _, err := parseDirs("both,up"); err == nil || !strings.Contains(err.Error(), `"up"`) {
		t.Errorf("parseDirs(both,up) = %v, want an error naming \"up\"", err)
	}
}

// TestOverlapNeedsFMA: on a device whose streams cannot launch the FMA
// kernel (the simulated one), the overlap measurement says so and adds
// nothing.
func TestOverlapNeedsFMA(t *testing.T) {
	b := simBench(t)
	res := results.New("transfer", "sim", "test")
	if err := b.overlap(res, 1, 1, transfer.Config{}); err == nil || !strings.Contains(err.Error(), "cannot launch the FMA kernel") {
		t.Errorf("overlap on the sim: %v", err)
	}
	if len(res.Rows) != 0 || len(res.Notes) != 0 {
		t.Errorf("overlap on the sim added %d rows and %d notes", len(res.Rows), len(res.Notes))
	}
	if cases := overlapCases(transfer.Config{}); len(cases) != 2+len(methods(transfer.Config{})) || cases[0].dir != htod || cases[len(cases)-1].dir != both {
		t.Errorf("overlap cases %+v", cases)
	}
}

// simBench is a bench of 1 MiB on a simulated H200 (wall clock),
// set up, and torn down and closed when t ends.
func simBench(t *testing.T) *bench {
	t.Helper()
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 64 << 20, Link: cudastream.H200Link()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	b := newBench(sim, 1<<20)
	if err := b.setup(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.teardown)
	return b
}
