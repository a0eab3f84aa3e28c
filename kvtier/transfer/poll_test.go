package transfer

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"kvtier.dev/cudastream"
)

// step moves the fixture's virtual clock to the device's next event and
// polls the engine, returning what Poll completed; ok is false when the
// device has nothing left to do.
func (f *fixture) step(t *testing.T, e *Engine) (n int, ok bool) {
	t.Helper()
	at, ok := f.sim.NextEvent()
	if !ok {
		return e.Poll(), false
	}
	if err := f.sim.AdvanceTo(at); err != nil {
		t.Fatal(err)
	}
	return e.Poll(), true
}

// settle steps the device until it is idle, polling e, and fails t on
// tr's error.
func (f *fixture) settle(t *testing.T, e *Engine, tr *Transfer) {
	t.Helper()
	for more := true; more; {
		_, more = f.step(t, e)
	}
	if err := tr.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestPolledEngineCompletesAtModelledTimes: a polled engine starts no
// goroutine, completes nothing until its device has (the virtual clock
// stands still without a step), completes each transfer in the Poll after
// the clock reaches its modelled end, layers in order, runs its OnDone there
// (which may submit the next transfer), and moves the bytes as the
// goroutine engine does.
func TestPolledEngineCompletesAtModelledTimes(t *testing.T) {
	f := newFixture(t, "layer-first", cudastream.H200Link())
	e := f.engine(t, Config{Polled: true})
	rng := rand.New(rand.NewPCG(3, 3))
	fill(rng, f.host.Pool[:8*f.host.SlotBytes])
	in, out := roundTripPairs(rng)
	on, err := e.Onboard(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if n := e.Poll(); n != 0 {
		t.Fatalf("Poll before the clock moved completed %d transfers", n)
	}
	var off *Transfer
	var order []string
	on.OnDone(func() {
		order = append(order, "onboard")
		// Submitting from inside Poll: the offload reads the blocks just loaded.
		if off, err = e.Offload(context.Background(), out); err != nil {
			t.Error(err)
			return
		}
		off.OnDone(func() { order = append(order, "offload") })
	})
	layerSeen := make([]bool, fxLayers)
	for {
		n, more := f.step(t, e)
		for l := range fxLayers {
			select {
			case <-on.layerDone[l]:
				if !layerSeen[l] {
					layerSeen[l] = true
					for k := 0; k < l; k++ {
						if !layerSeen[k] {
							t.Fatalf("layer %d marked done before layer %d", l, k)
						}
					}
				}
			default:
			}
		}
		now := f.sim.Clock().Now()
		for _, tr := range []*Transfer{on, off} {
			if tr == nil {
				continue
			}
			end, known := f.sim.EventTime(tr.final)
			done := false
			select {
			case <-tr.Done():
				done = true
			default:
			}
			if done != (known && end <= now) {
				t.Fatalf("at %v (Poll completed %d): %v done %v, its modelled end %v (known %v)", now, n, tr.kind, done, end, known)
			}
		}
		if !more {
			break
		}
	}
	if strings.Join(order, ",") != "onboard,offload" {
		t.Fatalf("OnDone ran %q, want onboard then offload", order)
	}
	for _, tr := range []*Transfer{on, off} {
		if err := tr.Err(); err != nil {
			t.Fatal(err)
		}
		if tr.Duration() <= 0 {
			t.Errorf("%v took %v on the virtual clock", tr.kind, tr.Duration())
		}
		tr.Release()
	}
	for i := range 8 {
		if !bytes.Equal(f.host.Slot(int32(i)), f.host.Slot(int32(16+i))) {
			t.Fatalf("slot %d came back different", i)
		}
	}
	// OnDone on a transfer already done runs at once.
	ran := false
	tr, err := e.Offload(context.Background(), out[:1])
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, more := f.step(t, e); !more {
			break
		}
	}
	tr.OnDone(func() { ran = true })
	if !ran {
		t.Fatal("OnDone on a done transfer did not run at once")
	}
	tr.Release()
}

// TestPolledEngineRefusesHostWaits: what would wait on the host is refused
// by a polled engine, and Close still completes what was submitted (and
// runs its OnDone).
func TestPolledEngineRefusesHostWaits(t *testing.T) {
	f := newFixture(t, "block-first", cudastream.H200Link())
	if _, err := New(f.sim, Config{GPU: f.gpu, Host: f.host, Polled: true, Sums: true}); err == nil || !strings.Contains(err.Error(), "Config.Polled and Config.Sums") {
		t.Fatalf("Polled with Sums: %v", err)
	}
	staging, err := f.sim.HostAlloc(f.host.SlotBytes)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(f.sim, Config{GPU: f.gpu, Host: f.host, Polled: true, Staging: [][]byte{staging}, Now: f.sim.Clock().Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.OnboardStaged(context.Background(), &blockSource{size: f.host.SlotBytes}, []int32{0}); err == nil || !strings.Contains(err.Error(), "polled") {
		t.Fatalf("OnboardStaged on a polled engine: %v", err)
	}
	tr, err := e.Onboard(context.Background(), []Pair{{GPUBlock: 1, HostSlot: 2}})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	tr.OnDone(func() { ran = true })
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tr.Done():
	default:
		t.Fatal("Close returned with a transfer not done")
	}
	if !ran || tr.Err() != nil {
		t.Fatalf("after Close: OnDone ran %v, err %v", ran, tr.Err())
	}
	tr.Release()
}
