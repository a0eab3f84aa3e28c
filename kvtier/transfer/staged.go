package transfer

import (
	"context"
	"errors"
	"fmt"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/codec/cudacodec"
)

// Source reads blocks for a staged onboard, for example from the NVMe tier.
type Source interface {
	// ReadBlock reads block i of the request into dst, which is one host
	// slot long and lies in a pinned staging buffer.
	ReadBlock(ctx context.Context, i int, dst []byte) error
}

// stagingBuf is one pinned buffer of the staging ring (Config.Staging),
// cut into slots of the host pool's size.
type stagingBuf struct {
	layout HostLayout
	base   uint64
	ev     cudastream.Event
	used   bool // ev has been recorded after a copy that reads the buffer
	pairs  []Pair
}

// setupStaging creates the event of each staging buffer (Config.Staging).
// Called by New; on error, Close releases what was built.
func (e *Engine) setupStaging(cfg *Config) error {
	for _, b := range cfg.Staging {
		ev, err := e.dev.NewEvent(cudastream.EventOptions{})
		if err != nil {
			return fmt.Errorf("transfer: staging event: %w", err)
		}
		l := HostLayout{Pool: b, SlotBytes: cfg.Host.SlotBytes}
		e.staging = append(e.staging, stagingBuf{layout: l, base: cudastream.HostAddr(b), ev: ev, pairs: make([]Pair, 0, l.Slots())})
	}
	return nil
}

// OnboardStaged reads blocks from src through the pinned staging ring and
// copies them to the GPU blocks gpuBlocks[i]. It reads into buffer k while
// buffer k-1 is still being copied, and waits for the copy that last read a
// buffer before overwriting it. Staged onboards run one at a time. Each
// staging buffer carries whole blocks, so every layer lands with the last
// block: the returned Transfer has one event per layer, as an Onboard's,
// all recorded after the last copy, so that a caller waits on layers the
// same way whatever the source.
func (e *Engine) OnboardStaged(ctx context.Context, src Source, gpuBlocks []int32) (*Transfer, error) {
	if e.polled {
		return nil, errors.New("transfer: OnboardStaged: a polled engine (Config.Polled) does not stage: refilling a staging buffer waits on the host")
	}
	if len(e.staging) == 0 {
		return nil, errors.New("transfer: OnboardStaged: the engine has no staging buffers (Config.Staging)")
	}
	for i, b := range gpuBlocks {
		if b < 0 || int(b) >= e.gpu.NumBlocks {
			return nil, fmt.Errorf("transfer: OnboardStaged: block %d: GPU block %d outside the layout's %d blocks", i, b, e.gpu.NumBlocks)
		}
	}
	t, err := e.newTransfer(cudastream.HostToDevice, e.gpu.Layers)
	if err != nil {
		return nil, err
	}
	if e.sums != nil {
		t.sumBlocks = append([]int32(nil), gpuBlocks...)
	}
	// Under the onboard lock, which Close takes to mark the engine closed:
	// once Close has started waiting, no staged onboard can join.
	e.on.mu.Lock()
	if e.closed.Load() {
		e.on.mu.Unlock()
		t.release()
		return nil, ErrClosed
	}
	t.startInFlight(&e.on)
	e.wg.Add(1)
	e.on.mu.Unlock()
	go func() {
		defer e.wg.Done()
		e.stagingMu.Lock()
		defer e.stagingMu.Unlock()
		e.runStaged(ctx, src, gpuBlocks, t)
		d := &e.on
		d.mu.Lock()
		if e.codec != nil {
			e.endCoded(d, t, false, 0) // the layers' events, on the ring's stream
		} else {
			for l, ev := range t.layerEv { // the last one is t.final
				if err := ev.Record(d.stream); err != nil && t.err == nil {
					t.err = fmt.Errorf("transfer: staged onboard: record layer %d event: %w", l, err)
				}
			}
		}
		d.mu.Unlock()
		e.enqueueSums(t)
		close(t.issued)
		e.stats.transfers.Add(1)
		e.stats.onboardBytes.Add(t.bytes)
		t.await()
	}()
	return t, nil
}

func (e *Engine) runStaged(ctx context.Context, src Source, gpuBlocks []int32, t *Transfer) {
	next := 0
	for k := 0; next < len(gpuBlocks); k++ {
		buf := &e.staging[k%len(e.staging)]
		if buf.used && !e.skipStagingWait {
			e.stats.stagingWaits.Add(1)
			if err := buf.ev.Synchronize(); err != nil {
				t.err = fmt.Errorf("transfer: staged onboard: wait for staging buffer %d: %w", k%len(e.staging), err)
				return
			}
		}
		buf.pairs = buf.pairs[:0]
		for s := 0; s < buf.layout.Slots() && next < len(gpuBlocks); s++ {
			if err := ctx.Err(); err != nil {
				t.err = err
				return
			}
			if err := src.ReadBlock(ctx, next, buf.layout.Slot(int32(s))); err != nil {
				t.err = fmt.Errorf("transfer: staged onboard: read block %d: %w", next, err)
				return
			}
			buf.pairs = append(buf.pairs, Pair{GPUBlock: gpuBlocks[next], HostSlot: int32(s)})
			next++
		}
		d := &e.on
		d.mu.Lock()
		if e.codec != nil {
			// The staging buffer is read by the chunks' DMAs, on d's stream;
			// whole blocks, a staging buffer at a time as the source reads
			// them: every layer is ready at the end.
			e.codeChunks(ctx, d, t, buf.pairs, &buf.layout, buf.base, false, cudacodec.Layers{First: 0, Count: e.gpu.Layers})
		} else {
			d.begin(ctx, t, "staged onboard, staging buffer", k%len(e.staging))
			d.co.addBlocks(&e.gpu, &buf.layout, buf.base, buf.pairs, true)
			d.end()
		}
		err := buf.ev.Record(d.stream)
		d.mu.Unlock()
		buf.used = true
		e.stats.blocks.Add(int64(len(buf.pairs) * e.gpu.Layers * e.gpu.Parts))
		if t.err != nil {
			return
		}
		if err != nil {
			t.err = fmt.Errorf("transfer: staged onboard: record staging event: %w", err)
			return
		}
	}
}
