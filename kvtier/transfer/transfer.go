package transfer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/invariants"
)

// Transfer is the handle of one submitted onboard or offload.
//
// The caller MUST call Release once the Transfer is done, to return its
// events to the engine; a Transfer MUST NOT be used after Release.
type Transfer struct {
	eng     *Engine
	kind    cudastream.CopyKind
	layerEv []cudastream.Event // onboard: one per layer, recorded in order
	// layerDone[l] is closed once layer l's event has completed (as seen
	// by the completer, which waits for the events in order), or once the
	// transfer is done. layersClosed counts those closed; only the
	// goroutine that completes the transfer touches it.
	layerDone    []chan struct{}
	layersClosed int
	final        cudastream.Event   // completes when every copy issued has
	owned        []cudastream.Event // events to hand back on Release

	bytes        int64
	copies       int
	kernelCopies int  // of copies, those the copy kernel moved
	gathered     bool // the transfer took the gather/scatter path
	coded        bool // the transfer took the codec path (codec.go)
	// timer times one of its codec launches, from timerRing's timers,
	// until finish reports it (codectime.go).
	timer        *kernelTimer
	timerRing    *codecRing
	gatherChunks int        // device staging chunks it moved
	inflight     *direction // counts t in its inflight until done
	start        time.Duration
	end          time.Duration
	err          error // set before done is closed; read only after
	done         chan struct{}
	issued       chan struct{} // closed once every event has been recorded

	// With a polled engine: the OnDone functions the Poll that completes
	// the transfer runs, and whether it has (guarded by cbMu).
	cbMu     sync.Mutex
	onDone   []func()
	finished bool

	// With Config.Sums (sums.go): the GPU blocks to sum, the buffer and
	// event of their sums, and the sums once done.
	sumBlocks []int32
	sumBuf    *sumBuf
	sumEv     cudastream.Event
	sums      []uint64
}

func (e *Engine) newTransfer(kind cudastream.CopyKind, layers int) (*Transfer, error) {
	n := max(layers, 1)
	t := &Transfer{eng: e, kind: kind, start: e.now(), done: make(chan struct{}), issued: make(chan struct{}), owned: make([]cudastream.Event, 0, n)}
	for i := 0; i < n; i++ {
		ev, err := e.events.get()
		if err != nil {
			t.release()
			return nil, fmt.Errorf("transfer: event: %w", err)
		}
		t.owned = append(t.owned, ev)
	}
	if layers > 0 {
		t.layerEv = t.owned
		t.layerDone = make([]chan struct{}, layers)
		for l := range t.layerDone {
			t.layerDone[l] = make(chan struct{})
		}
	}
	t.final = t.owned[len(t.owned)-1]
	return t, nil
}

// await waits on the host, in order, for each layer's event (marking the
// layer done) and then for the final one, and marks the transfer done. It
// runs on the engine's completer goroutines, never on a caller's path.
func (t *Transfer) await() {
	var err error
	for l, ev := range t.layerEv {
		if err = ev.Synchronize(); err != nil {
			break
		}
		close(t.layerDone[l])
		t.layersClosed = l + 1
	}
	if err == nil {
		err = t.final.Synchronize()
	}
	if err == nil {
		err = t.awaitSums()
	}
	t.finish(err)
}

// finish marks the transfer done. err is the completion's error, if any; a
// submission error already in t.err wins. Layers not yet marked done are
// marked after the transfer: their waiters then see its error.
func (t *Transfer) finish(err error) {
	if t.err == nil && err != nil {
		t.err = fmt.Errorf("transfer: %s of %d bytes: %w", t.kind, t.bytes, err)
	}
	t.end = t.eng.now()
	t.reportKernel(t.eng.onKernel)
	if t.inflight != nil {
		t.inflight.inflight.Add(-1)
	}
	close(t.done)
	for _, c := range t.layerDone[t.layersClosed:] {
		close(c)
	}
	t.layersClosed = len(t.layerDone)
	if t.eng.polled {
		t.cbMu.Lock()
		fns := t.onDone
		t.onDone, t.finished = nil, true
		t.cbMu.Unlock()
		for _, fn := range fns {
			fn()
		}
	}
}

// OnDone arranges for fn to run once the transfer is done. With a polled
// engine (Config.Polled) it runs at once if the transfer is done already,
// and otherwise inside the Poll (or Close) that completes it, on that
// goroutine; with an engine that is not polled it runs on a goroutine of
// its own. fn may submit transfers and may Release this one.
func (t *Transfer) OnDone(fn func()) {
	if !t.eng.polled {
		go func() {
			<-t.done
			fn()
		}()
		return
	}
	t.cbMu.Lock()
	if t.finished {
		t.cbMu.Unlock()
		fn()
		return
	}
	t.onDone = append(t.onDone, fn)
	t.cbMu.Unlock()
}

// startInFlight counts t as d's work in flight until it is done. Every
// transfer counted MUST reach finish.
func (t *Transfer) startInFlight(d *direction) {
	t.inflight = d
	d.inflight.Add(1)
}

// Done is closed when every copy the transfer issued has completed on the
// device. Only then may its memory be reused.
func (t *Transfer) Done() <-chan struct{} { return t.done }

// Wait blocks until the transfer is done and returns its error, or returns
// ctx's error first if ctx ends. A Wait that returns early does not stop
// the copies: the transfer's memory stays in use until Done is closed.
func (t *Transfer) Wait(ctx context.Context) error {
	select {
	case <-t.done:
		return t.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Err is the transfer's error once it is done (nil before). A transfer that
// failed or was cancelled moved some of its bytes and not others: its data
// MUST NOT be used.
func (t *Transfer) Err() error {
	select {
	case <-t.done:
		return t.err
	default:
		return nil
	}
}

// Bytes is the number of bytes the transfer issued.
func (t *Transfer) Bytes() int64 { return t.bytes }

// Copies is the number of copy descriptors issued after coalescing.
func (t *Transfer) Copies() int { return t.copies }

// KernelCopies is the number of those descriptors the copy kernel moved;
// the rest went to batches or single copies (Config.Method).
func (t *Transfer) KernelCopies() int { return t.kernelCopies }

// GatherChunks is the number of device staging chunks the transfer moved
// through the gather/scatter path (MethodGather, or MethodAuto's choice of
// it), 0 when it copied directly. Its Copies are then the chunks' DMAs.
func (t *Transfer) GatherChunks() int { return t.gatherChunks }

// Duration is the time from submission to observed completion (zero before
// Done), on the engine's clock.
func (t *Transfer) Duration() time.Duration {
	select {
	case <-t.done:
		return t.end - t.start
	default:
		return 0
	}
}

// Layers is the number of per-layer events: the GPU layout's layer count
// for onboards (staged ones included), 0 for offloads.
func (t *Transfer) Layers() int { return len(t.layerEv) }

// Issued is closed once the transfer's events have been recorded: when
// Onboard or Offload returns for direct copies; for the gather path once
// its goroutine has submitted every chunk (Engine.gatherAsync); for a
// staged onboard once its last block has been read and its copies
// enqueued.
func (t *Transfer) Issued() <-chan struct{} { return t.issued }

// LayerEvent returns the event that completes when layer l's blocks are on
// the device. The compute stream waits on it (Stream.WaitEvent) before
// running layer l. An event not yet recorded would count as complete, so
// LayerEvent first waits until the transfer is issued (at once for direct
// copies, after the submission for the gather path and staged onboards).
// The event belongs to the transfer: do not record or destroy it, and do
// not use it after Release.
func (t *Transfer) LayerEvent(l int) cudastream.Event {
	<-t.issued
	return t.layerEv[l]
}

// LayerReady reports whether layer l's copies have completed (false until
// the transfer is issued).
func (t *Transfer) LayerReady(l int) (bool, error) {
	select {
	case <-t.issued:
		return t.layerEv[l].Query()
	default:
		return false, nil
	}
}

// WaitLayer blocks the host until layer l's copies have completed (for CPU
// users of the KV; a GPU stream waits on LayerEvent instead, without
// blocking the host), and returns the transfer's error if it failed by
// then, or ctx's error first if ctx ends. The wait follows the engine's
// completer, which observes the layers in order.
func (t *Transfer) WaitLayer(ctx context.Context, l int) error {
	if l < 0 || l >= len(t.layerEv) {
		return fmt.Errorf("transfer: WaitLayer: layer %d outside the transfer's %d layers", l, len(t.layerEv))
	}
	select {
	case <-t.layerDone[l]:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-t.done:
		return t.err
	default:
		return nil
	}
}

// Release returns the transfer's events to the engine. It MUST be called
// only after Done is closed.
func (t *Transfer) Release() {
	select {
	case <-t.done:
	default:
		invariants.Failf("Release before the transfer is done")
	}
	t.release()
}

func (t *Transfer) release() {
	for _, ev := range t.owned {
		t.eng.events.put(ev)
	}
	t.owned, t.layerEv, t.final = nil, nil, nil
}
