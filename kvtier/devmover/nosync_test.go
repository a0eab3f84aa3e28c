package devmover

import (
	"bytes"
	"context"
	"testing"
	"testing/synctest"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
)

// requestPath is a fixture on a wall-clock sim inside synctest.Test, whose
// fake clock stands still while any goroutine of the bubble runs: a request
// path that never blocks the host leaves time.Now unchanged, and one that
// waits for a copy (a Synchronize, a Wait, a channel the copy's completion
// closes) lets the clock move to the copy's end.
type requestPath struct {
	f       *devFixture
	compute cudastream.Stream
	scratch cudastream.DevicePtr
	cached  []int32 // 3 blocks in the host tier only
	prompt  []int32 // cached and one more block
}

func newRequestPath(t *testing.T) *requestPath {
	t.Helper()
	f := newDevFixture(t, devOpts{gpu: 8, host: 16, writeThrough: true,
		simCfg: cudastream.SimConfig{Link: cudastream.H200Link(), Clock: cudastream.SimWallClock}})
	p := &requestPath{f: f, cached: f.request(3)}
	p.prompt = append(append([]int32{}, p.cached...), f.request(1)...)
	var w kvtier.Lease
	f.prefill(t, p.cached, &w) // write-through: a copy lands in the host
	f.m.Release(&w)
	f.mover.Wait()
	f.prefill(t, f.request(8), &w) // pushes the cached blocks out of the GPU
	f.m.Release(&w)
	f.mover.Wait()
	var err error
	if p.compute, err = f.dev.NewStream(0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.compute.Destroy() })
	if p.scratch, err = f.dev.Alloc(1 << 20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.dev.Free(p.scratch) })
	return p
}

// produce enqueues, on the compute stream, a step that writes kv into GPU
// slot s: a slow pageable copy (the step's other work) and then the block's
// KV, and returns the event recorded after it.
func (p *requestPath) produce(t *testing.T, s kvtier.Slot, kv []byte) cudastream.Event {
	t.Helper()
	if err := p.compute.CopyHtoD(p.scratch, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := p.compute.CopyHtoD(p.f.gpuAddr(s), kv); err != nil {
		t.Fatal(err)
	}
	ev, err := p.f.dev.NewEvent(cudastream.EventOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ev.Destroy() })
	if err := ev.Record(p.compute); err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestRequestPathNoHostSync: a request's path (Lookup, Plan, Onboard, the
// compute stream waiting on each layer's event, Insert, the prefill step
// enqueued, CommitAfter with its write-through copy) never waits on the
// host for a copy; the layers land in order with the compute stream
// starting after layer 0 and before the last; and the write-through copy,
// which waits for the producer's event on the device, copies the produced
// bytes. A host synchronisation anywhere on the path fails the test (the
// control below shows that the clock does move for one).
func TestRequestPathNoHostSync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newRequestPath(t)
		f, m := p.f, p.f.m
		ctx := context.Background()

		start := time.Now()
		var l, w kvtier.Lease
		if err := m.Lookup(1, p.prompt, &l); err != nil {
			t.Fatal(err)
		}
		if err := m.Plan(&l); err != nil {
			t.Fatal(err)
		}
		if err := m.Onboard(&l); err != nil {
			t.Fatal(err)
		}
		var evs []kvtier.Event
		var layerEv [dmLayers][]kvtier.Event
		for layer := range dmLayers {
			var err error
			if evs, err = l.LayerEvents(layer, evs[:0]); err != nil {
				t.Fatal(err)
			}
			layerEv[layer] = append([]kvtier.Event(nil), evs...)
			for _, ev := range evs {
				if err := p.compute.WaitEvent(ev.(cudastream.Event)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := m.Insert(1, p.prompt, kvtier.GPU, &w); err != nil {
			t.Fatal(err)
		}
		nw := w.Blocks[len(w.Blocks)-1]
		kv := detKV(nw.Key)
		written := p.produce(t, nw.Slot, kv)
		if err := m.CommitAfter(&w, written); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("the request path waited %v on the host", d)
		}

		if len(l.Blocks) != 3 || len(layerEv[0]) == 0 {
			t.Fatalf("looked up %d blocks with %d layer events, want 3 loading from the host", len(l.Blocks), len(layerEv[0]))
		}
		for _, b := range l.Blocks {
			if b.Tier != kvtier.Host || !b.Loading {
				t.Fatalf("block %#x: tier %v loading %v, want a load from the host", uint64(b.Key), b.Tier, b.Loading)
			}
		}
		for _, ev := range append(layerEv[dmLayers-1], written) {
			if done, _ := ev.Query(); done {
				t.Fatal("an event was complete before any time passed")
			}
		}
		sim := f.dev.(*cudastream.Sim)
		if err := l.WaitLayer(ctx, 0); err != nil {
			t.Fatal(err)
		}
		layer0 := sim.Clock().Now()
		if err := m.Wait(ctx, &l); err != nil {
			t.Fatal(err)
		}
		first, _ := sim.EventTime(layerEv[0][0].(cudastream.Event))
		last, ok := sim.EventTime(layerEv[dmLayers-1][0].(cudastream.Event))
		if !ok || first >= last || layer0 != first {
			t.Errorf("layer 0 landed at %v, the last layer at %v (%v); the host wait for layer 0 returned at %v", first, last, ok, layer0)
		}
		if err := m.Wait(ctx, &w); err != nil {
			t.Fatal(err)
		}
		for _, b := range l.Blocks {
			if got := f.readGPU(t, b.GPUSlot); !bytes.Equal(got, f.want[b.Key]) {
				t.Errorf("block %#x: GPU slot %d holds other bytes after the load", uint64(b.Key), b.GPUSlot)
			}
		}
		if got := p.hostCopy(t, nw.Key); !bytes.Equal(got, kv) {
			t.Error("the write-through copy did not wait for the producer's event: the host holds other bytes")
		}
		m.Release(&w)
		m.Release(&l)

		before := time.Now() // the control: a host synchronisation moves the clock
		f.readGPU(t, nw.Slot)
		if time.Since(before) == 0 {
			t.Error("a Synchronize did not move the clock: the check above proves nothing")
		}
	})
}

// TestCommitWithoutEventCopiesEarly is the control of the producer check:
// a Commit (no event) while the step is still enqueued lets the
// write-through copy run before the step has written the block, so the
// host copy holds other bytes. CommitAfter exists for this.
func TestCommitWithoutEventCopiesEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newRequestPath(t)
		m := p.f.m
		var w kvtier.Lease
		if err := m.Insert(1, p.f.request(1), kvtier.GPU, &w); err != nil {
			t.Fatal(err)
		}
		nw := w.Blocks[0]
		kv := detKV(nw.Key)
		p.produce(t, nw.Slot, kv)
		if err := m.Commit(&w, nil); err != nil { // wrong: the step has not run
			t.Fatal(err)
		}
		if err := m.Wait(context.Background(), &w); err != nil {
			t.Fatal(err)
		}
		if got := p.hostCopy(t, nw.Key); bytes.Equal(got, kv) {
			t.Error("the copy without the producer's event still saw the produced bytes: the check in TestRequestPathNoHostSync proves nothing")
		}
		if err := p.compute.Synchronize(); err != nil {
			t.Fatal(err)
		}
		m.Release(&w)
	})
}

// hostCopy returns the bytes of block k's host slot.
func (p *requestPath) hostCopy(t *testing.T, k kvtier.Key) []byte {
	t.Helper()
	in, ok := p.f.m.Peek(1, k)
	if !ok || !in.Ready[kvtier.Host] {
		t.Fatalf("block %#x is not ready in the host tier: %+v", uint64(k), in)
	}
	return p.f.host.Slot(int32(in.Slot[kvtier.Host]))
}
