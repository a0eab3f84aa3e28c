package engine

import (
	"fmt"

	"kvtier.dev/cudastream"
)

// LayerWait says where a prefill's forward pass waits for the loads of each
// layer (Config.LayerWait).
type LayerWait uint8

const (
	// LayerWaitDevice hands the pass each layer's load events
	// (model.Plan.LayerEvents): the runner's stream waits on them, and the
	// host enqueues every layer at once. A load's failure is seen after
	// the pass (Manager.Wait), which is then discarded and retried.
	LayerWaitDevice LayerWait = iota
	// LayerWaitHost blocks the host before it enqueues a layer until the
	// layer's loads have landed (Lease.WaitLayer through model.Plan.Ready);
	// a failure ends the pass there.
	LayerWaitHost
	NumLayerWaits
)

var layerWaitNames = [NumLayerWaits]string{"device", "host"}

func (w LayerWait) String() string {
	if w < NumLayerWaits {
		return layerWaitNames[w]
	}
	return fmt.Sprintf("LayerWait(%d)", uint8(w))
}

// ParseLayerWait is the inverse of String.
func ParseLayerWait(s string) (LayerWait, error) {
	for w, name := range layerWaitNames {
		if s == name {
			return LayerWait(w), nil
		}
	}
	return 0, fmt.Errorf("engine: layer wait %q: want %q or %q", s, layerWaitNames[LayerWaitDevice], layerWaitNames[LayerWaitHost])
}

// layerEvents is model.Plan.LayerEvents over s's lookup: the device events
// of layer l's loads. For the last layer it also starts lc's watch of the
// load's end (watchLoad), the host having no wait of its own to time.
func (e *Engine) layerEvents(s *seq, lc *loadClock, l int, dst []cudastream.Event) ([]cudastream.Event, error) {
	var err error
	e.kvEvents, err = s.look.LayerEvents(l, e.kvEvents[:0])
	if err != nil {
		return dst, fmt.Errorf("engine: request %s: %w", s.req.ID, err)
	}
	first := len(dst)
	for i, ev := range e.kvEvents {
		ce, ok := ev.(cudastream.Event)
		if !ok {
			return dst[:first], fmt.Errorf("engine: request %s: layer %d: the mover's event %d (%T) is not a device event", s.req.ID, l, i, ev)
		}
		dst = append(dst, ce)
	}
	clear(e.kvEvents)
	if l == e.cfg.Model.Layers-1 && lc.watch != nil {
		lc.watchLoad(dst[first:])
	}
	return dst, nil
}

// watchLoad records, on a goroutine of its own, when evs (the last layer's
// loads) complete, as loadClock.wait does for a host wait: only a wait that
// blocked marks the load's end. The caller MUST call joinWatch before it
// reads lc.done or releases the lease the events belong to.
func (lc *loadClock) watchLoad(evs []cudastream.Event) {
	if lc.watching { // a runner that asked for the last layer twice
		return
	}
	evs = append([]cudastream.Event(nil), evs...)
	go func() {
		defer close(lc.watch)
		_ = lc.wait(func() error {
			for _, ev := range evs {
				if err := ev.Synchronize(); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	lc.watching = true
}

// joinWatch waits for watchLoad's goroutine, if one started.
func (lc *loadClock) joinWatch() {
	if lc.watching {
		<-lc.watch
		lc.watching = false
	}
}
