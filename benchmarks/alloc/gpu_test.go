package main

import (
	"context"
	"errors"
	"testing"

	"kvtier.dev/internal/gputest"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/pinned"
)

// TestGPUCopiesAtPinnedSpeed: the copy engine reads and writes a region made
// by pinned.Alloc (data intact both ways), and device-to-host copies into it
// run within 10% of copies into cuMemHostAlloc memory.
func TestGPUCopiesAtPinnedSpeed(t *testing.T) {
	dev := gputest.Device(t)
	for _, pages := range []pinned.PageMode{pinned.Pages4K, pinned.PagesTHP} {
		res, err := copyCheck(context.Background(), dev, 2<<30, 3, pages)
		if err != nil {
			t.Fatalf("%v: %v", pages, err)
		}
		p, h := results.Median(res.dtohPinned), results.Median(res.dtohHostAlloc)
		t.Logf("%v: DtoH %.2f GiB/s into the region, %.2f into cuMemHostAlloc; HtoD %.2f vs %.2f",
			pages, p, h, results.Median(res.htodPinned), results.Median(res.htodHostAlloc))
		if p < 0.9*h {
			t.Errorf("%v: DtoH into the pinned region %.2f GiB/s is below 90%% of cuMemHostAlloc's %.2f", pages, p, h)
		}
	}
}

// TestGPUAllocCancelAndReuse: a cancellation midway returns the error for
// the right chunk and leaves the driver able to pin again.
func TestGPUAllocCancelAndReuse(t *testing.T) {
	dev := gputest.Device(t)
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	_, err := pinned.Alloc(ctx, 4<<30, pinned.Options{Registrar: dev, ChunkBytes: 512 << 20,
		OnChunk: func(pinned.Chunk) {
			if n++; n == 2 {
				cancel()
			}
		}})
	var ce *pinned.ChunkError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &ce) || ce.Index != 2 {
		t.Fatalf("cancelled after 2 chunks: %v", err)
	}
	r, err := pinned.Alloc(context.Background(), 4<<30, pinned.Options{Registrar: dev})
	if err != nil {
		t.Fatal(err)
	}
	st := r.Stats()
	t.Logf("4 GiB: %.2f GiB/s end to end (touch %.2f, register %.2f; %s)", st.TotalGiBPerSec(), st.TouchGiBPerSec(), st.RegisterGiBPerSec(), st.CPUNote)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}
