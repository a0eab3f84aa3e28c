package main

import (
	"context"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/pinned"
)

// TestCopyCheckOnSim runs copyCheck on the simulated device: the data
// comes back intact both ways, and every run gives a rate per direction
// and memory.
func TestCopyCheckOnSim(t *testing.T) {
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 64 << 20, Link: cudastream.H200Link()})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	const runs = 3
	res, err := copyCheck(context.Background(), sim, 8<<20, runs, pinned.Pages4K)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string][]float64{"DtoH cuMemHostAlloc": res.dtohHostAlloc, "DtoH pinned": res.dtohPinned,
		"HtoD cuMemHostAlloc": res.htodHostAlloc, "HtoD pinned": res.htodPinned} {
		if len(v) != runs {
			t.Errorf("%s: %d rates, want %d", name, len(v), runs)
		}
		for _, r := range v {
			if !(r > 0) {
				t.Errorf("%s: rate %v", name, r)
			}
		}
	}
	// Too little device memory: the allocation's error, nothing left over.
	if _, err := copyCheck(context.Background(), sim, 128<<20, 1, pinned.Pages4K); err == nil {
		t.Error("a copy larger than the device's memory did not fail")
	}
}
