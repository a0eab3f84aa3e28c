package cudastream_test

import (
	"errors"
	"testing"

	"kvtier.dev/internal/gputest"

	. "kvtier.dev/cudastream"
)

// A simulated event has no driver handle: EventHandle says so, and does
// not hand out a number a driver call would misread.
func TestEventHandleSim(t *testing.T) {
	sim, err := NewSim(SimConfig{MemoryBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	ev, err := sim.NewEvent(EventOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()
	h, err := EventHandle(ev)
	if !errors.Is(err, ErrNotSupported) || h != 0 {
		t.Fatalf("EventHandle(sim event) = %#x, %v; want 0 and ErrNotSupported", h, err)
	}
}

// TestCuEventHandle: a driver event has a handle, distinct per event, until
// it is destroyed.
func TestCuEventHandle(t *testing.T) {
	d := gputest.Device(t)
	a, err := d.NewEvent(EventOptions{})
	cuMust(t, "NewEvent", err)
	b, err := d.NewEvent(EventOptions{})
	cuMust(t, "NewEvent", err)
	defer b.Destroy()
	ha, err := EventHandle(a)
	cuMust(t, "EventHandle", err)
	hb, err := EventHandle(b)
	cuMust(t, "EventHandle", err)
	if ha == 0 || hb == 0 || ha == hb {
		t.Fatalf("handles %#x and %#x: want two distinct non-zero handles", ha, hb)
	}
	cuMust(t, "Destroy", a.Destroy())
	if h, err := EventHandle(a); !errors.Is(err, ErrInvalidValue) || h != 0 {
		t.Fatalf("EventHandle(destroyed) = %#x, %v; want 0 and ErrInvalidValue", h, err)
	}
}
