package devmover

import (
	"context"
	"fmt"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/transfer"
)

// runBounce moves GPU blocks to the store through the bounce slots, a few
// at a time: it waits for one free slot, takes whatever others are free, and
// never holds slots while waiting for more (so jobs cannot deadlock).
func (d *Mover) runBounce(j *job) {
	defer d.wg.Done()
	n := len(j.bounce)
	pairs := make([]transfer.Pair, 0, cap(d.bounceSlots))
	ws := make([]write, 0, cap(d.bounceSlots))
	for next := 0; next < n; {
		pairs = append(pairs[:0], transfer.Pair{GPUBlock: j.bounce[next].gpu, HostSlot: <-d.bounceSlots})
	more:
		for len(pairs) < n-next {
			select {
			case s := <-d.bounceSlots:
				pairs = append(pairs, transfer.Pair{GPUBlock: j.bounce[next+len(pairs)].gpu, HostSlot: s})
			default:
				break more
			}
		}
		k := len(pairs)
		sums, err := d.bounceCopy(pairs, j.afters)
		ws = ws[:0]
		for c := range k {
			b := &j.bounce[next+c]
			w := nvme.WriteOp{Slot: d.nvmeSlot[b.to], Meta: b.meta, Payload: d.bounceHost.Slot(pairs[c].HostSlot)[:d.blockBytes]}
			w.Meta.Codec = uint8(d.nvmeCodec)
			if c < len(sums) && d.bounceSums {
				w.WordSum, w.WordSummed = sums[c], true
			}
			ws = append(ws, write{i: b.i, to: b.to, op: w})
		}
		errs := make([]error, k)
		for c := range ws {
			if err != nil {
				errs[c] = fmt.Errorf("gpu to nvme through bounce slot %d: %w", pairs[c].HostSlot, err)
				d.stats.failed(1, errs[c])
				continue
			}
			ws[c].ticket = d.drive.ticket()
			errs[c] = d.writeInTurn(j.b, ws[c:c+1], fmt.Sprintf("bounce slot %d", pairs[c].HostSlot))
		}
		for _, p := range pairs { // the writes have returned: reuse is safe
			d.bounceSlots <- p.HostSlot
		}
		for c, w := range ws {
			j.b.Complete(w.i, errs[c])
		}
		next += k
	}
}

// bounceCopy offloads pairs into the bounce pool, on the device after
// after (nil: at once), and waits for the copy. It returns the blocks' word
// sums when the bounce engine sums (nil otherwise). It runs on the mover's
// goroutine, off the request's path.
func (d *Mover) bounceCopy(pairs []transfer.Pair, after []cudastream.Event) ([]uint64, error) {
	tr, err := d.bounce.Offload(context.Background(), pairs, after...)
	if err != nil {
		return nil, err
	}
	<-tr.Done()
	err = tr.Err()
	sums := append([]uint64(nil), tr.Sums()...)
	tr.Release()
	return sums, err
}
