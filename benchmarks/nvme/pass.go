package main

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"kvtier.dev/kvtier/nvme"
)

// warmUp writes every slot through the tier, untimed, so that the file is
// allocated on the drive and the reads find blocks; with --gpu, the
// word-summed store's too.
func (b *bench) warmUp() error {
	if _, err := b.pass(true, false, modeTier); err != nil {
		return err
	}
	if b.gpu != nil {
		if _, err := b.pass(true, false, modeTierGPU); err != nil {
			return err
		}
	}
	return nil
}

// pass moves every slot once, in order or shuffled (random), in mode m,
// from --depth goroutines; it returns the payload's GiB/s and the first
// error.
func (b *bench) pass(write, random bool, m mode) (float64, error) {
	order := b.seq
	if random {
		order = b.perm
	}
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	t0 := time.Now()
	for g := range b.o.depth {
		wg.Go(func() {
			var err error
			if m == modeRawCopy || m == modeTierGPU {
				err = b.gpuPass(b.gpu.workers[g], &next, order, write, m)
			} else {
				err = b.cpuPass(g, &next, order, write, m)
			}
			if err != nil {
				once.Do(func() { firstErr = err })
			}
		})
	}
	wg.Wait()
	el := time.Since(t0).Seconds()
	return float64(len(order)) * float64(b.bs) / (1 << 30) / el, firstErr
}

// cpuPass is goroutine g's share of a pass in a mode without the GPU: the
// next block of order, one at a time, until none is left or one fails.
func (b *bench) cpuPass(g int, next *atomic.Int64, order []int, write bool, m mode) error {
	ctx := context.Background()
	buf, hdr := b.bufs[g], b.hdrs[g]
	for {
		i := int(next.Add(1) - 1)
		if i >= len(order) {
			return nil
		}
		if err := b.moveBlock(ctx, b.slots[order[i]], buf, hdr, write, m); err != nil {
			return err
		}
	}
}

// moveBlock writes buf to slot, or reads slot into buf (and hdr), as mode m
// does.
func (b *bench) moveBlock(ctx context.Context, slot nvme.Slot, buf, hdr []byte, write bool, m mode) error {
	switch {
	case m == modeTier && write:
		return b.s.Write(ctx, slot, nvme.BlockMeta{Key: uint64(slot) + 1, Parent: uint64(slot), Salt: 1}, buf)
	case m == modeTier:
		_, err := b.s.Read(ctx, slot, buf)
		return err
	case write: // a raw+touch write too: its payload is not touched
		return full(unix.Pwrite, b.raw, buf, b.payloadOff(slot))
	case m == modeRawHdr:
		return fullv(b.raw, hdr, buf, b.payloadOff(slot)-int64(b.info.HeaderBytes))
	case m == modeRawTouch:
		err := full(unix.Pread, b.raw, buf, b.payloadOff(slot))
		touched.Add(int64(bytes.Count(buf, touchByte)))
		return err
	default:
		return full(unix.Pread, b.raw, buf, b.payloadOff(slot))
	}
}

// gpuScratch is what one goroutine's GPU pass reuses from batch to batch.
type gpuScratch struct {
	rd   [1]nvme.ReadOp
	wr   [1]nvme.WriteOp
	want []uint64 // the headers' word sums of a batch read
}

// gpuPass is one goroutine's share of a pass in a GPU mode: batches of
// --gpu-batch blocks, each batch one round trip to the GPU, each block
// its own I/O as in the raw rows.
func (b *bench) gpuPass(w *gpuWorker, next *atomic.Int64, order []int, write bool, m mode) error {
	ctx := context.Background()
	k := int64(len(w.bufs))
	sc := &gpuScratch{want: make([]uint64, 0, k)}
	tier := m == modeTierGPU
	for {
		i0 := int(next.Add(k) - k)
		n := min(int(k), len(order)-i0)
		if n <= 0 {
			return nil
		}
		batch := order[i0 : i0+n]
		var err error
		if write {
			err = b.gpuWrite(ctx, w, sc, batch, tier)
		} else {
			err = b.gpuRead(ctx, w, sc, batch, tier)
		}
		if err != nil {
			return err
		}
	}
}

// gpuWrite copies a batch out of the GPU (summed there, with tier) and
// writes each block: raw, or through the word-summed store.
func (b *bench) gpuWrite(ctx context.Context, w *gpuWorker, sc *gpuScratch, batch []int, tier bool) error {
	sums, err := w.fromDevice(len(batch), tier)
	if err != nil {
		return err
	}
	for j, o := range batch {
		if !tier {
			if err := full(unix.Pwrite, b.raw, w.bufs[j], b.payloadOff(b.slots[o])); err != nil {
				return err
			}
			continue
		}
		slot := b.slots2[o]
		sc.wr[0] = nvme.WriteOp{Slot: slot, Meta: nvme.BlockMeta{Key: uint64(slot) + 1, Parent: uint64(slot), Salt: 1},
			Payload: w.bufs[j], WordSummed: true, WordSum: sums[j]}
		if err := b.s2.WriteBatch(ctx, sc.wr[:]); err != nil {
			return err
		}
		if sc.wr[0].Err != nil {
			return sc.wr[0].Err
		}
	}
	return nil
}

// gpuRead reads a batch, raw or through the word-summed store with the
// check deferred, copies it into the GPU and, with tier, compares the
// GPU's word sums with the headers'.
func (b *bench) gpuRead(ctx context.Context, w *gpuWorker, sc *gpuScratch, batch []int, tier bool) error {
	sc.want = sc.want[:0]
	rd := &sc.rd
	for j, o := range batch {
		if !tier {
			if err := full(unix.Pread, b.raw, w.bufs[j], b.payloadOff(b.slots[o])); err != nil {
				return err
			}
			continue
		}
		rd[0] = nvme.ReadOp{Slot: b.slots2[o], Dst: w.bufs[j], DeferWordSum: true, Meta: nvme.BlockMeta{Tokens: rd[0].Meta.Tokens[:0]}}
		if err := b.s2.ReadBatch(ctx, rd[:]); err != nil {
			return err
		}
		if rd[0].Err != nil {
			return rd[0].Err
		}
		if !rd[0].Deferred {
			return fmt.Errorf("slot %d: the store checked a word-summed payload itself", rd[0].Slot)
		}
		sc.want = append(sc.want, rd[0].Check.WordSum)
	}
	sums, err := w.toDevice(len(batch), tier)
	if err != nil {
		return err
	}
	for j := range sc.want {
		if sums[j] != sc.want[j] {
			return fmt.Errorf("slot %d: the GPU's word sum %#x is not the header's %#x", b.slots2[batch[j]], sums[j], sc.want[j])
		}
	}
	return nil
}
