package devmover

import (
	"context"
	"fmt"
	"sync/atomic"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/transfer"
)

// finishEngine completes ops idx of t when the engine's transfer is done,
// never before (Transfer.OnDone: on a goroutine of the engine's, or inside
// a polled engine's Poll). src, for a staged onboard, names the op whose
// NVMe block was lost. each, if set, runs for op k of a transfer done
// without error, before the transfer is released, and returns that op's
// error.
func (d *Mover) finishEngine(t *kvtier.Batch, idx []int, tr *transfer.Transfer, what string, src *storeSource, each func(k int, tr *transfer.Transfer) error) {
	ly := &engineLayers{tr: tr}
	ly.refs.Store(1)
	if tr.Layers() > 0 {
		ly.refs.Add(1)
		t.AddLayers(ly)
	}
	if d.testEarly {
		for _, i := range idx {
			t.Complete(i, nil)
		}
		d.wg.Add(1)
		tr.OnDone(func() {
			defer d.wg.Done()
			ly.Release()
		})
		return
	}
	d.wg.Add(1)
	tr.OnDone(func() {
		defer d.wg.Done()
		err := tr.Err()
		var errs []error
		if err == nil && each != nil {
			errs = make([]error, len(idx))
			for k := range idx {
				if errs[k] = each(k, tr); errs[k] != nil {
					errs[k] = fmt.Errorf("%s of %d blocks: block %d: %w", what, len(idx), k, errs[k])
					d.stats.failed(1, errs[k])
				}
			}
		}
		ly.Release()
		if err != nil {
			err = fmt.Errorf("%s of %d blocks: %w", what, len(idx), err)
			d.stats.failed(len(idx), err)
		}
		for k, i := range idx {
			e := err
			if e != nil && src != nil && k == src.lost {
				e = fmt.Errorf("%w: %w", kvtier.ErrSourceLost, e)
			}
			if errs != nil {
				e = errs[k]
			}
			t.Complete(i, e)
		}
	})
}

// engineLayers hands an engine transfer's layer events to the manager
// (Batch.AddLayers). The transfer's events return to the engine once both
// the transfer is done and the manager has released them: refs counts the
// two.
type engineLayers struct {
	tr   *transfer.Transfer
	refs atomic.Int32
}

func (e *engineLayers) NumLayers() int { return e.tr.Layers() }

// LayerEvent implements Layers. For a load staged from NVMe, or one
// through the gather path, the transfer's LayerEvent first waits until the
// engine has recorded the events: an event not yet recorded would count as
// complete.
func (e *engineLayers) LayerEvent(l int) kvtier.Event { return e.tr.LayerEvent(l) }

func (e *engineLayers) WaitLayer(ctx context.Context, l int) error { return e.tr.WaitLayer(ctx, l) }

// Release implements Layers (and the mover's own release once the
// transfer is done).
func (e *engineLayers) Release() {
	if e.refs.Add(-1) == 0 {
		e.tr.Release()
	}
}
