package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/gpu"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/kvtier/transfer"
)

// wait is where a pass waits for its layers' loads.
type wait int

const (
	hostWait   wait = iota // the host blocks before each layer (Transfer.WaitLayer)
	deviceWait             // the model's stream waits on each layer's event
	numWaits
)

func (w wait) String() string { return [numWaits]string{"host wait", "device wait"}[w] }

// split is one prefill: total tokens, the first loaded of them loaded from
// the host tier (a multiple of the block), the rest computed.
type split struct{ total, loaded int }

func (s split) String() string { return fmt.Sprintf("%d tokens, %d loaded", s.total, s.loaded) }

// rig is a GPU model over a KV region whose prefix blocks also lie in a
// pinned host pool, and kvtier's copy engine between the two: a pass loads
// its prefix from the pool through the engine, as the server's onboards
// do, and computes the rest.
type rig struct {
	dev     cudastream.Device
	c       model.Config
	region  cudastream.DevicePtr
	slots   int
	m       *gpu.Model
	pool    []byte // pinned: host slot i holds GPU block i's KV
	eng     *transfer.Engine
	st      cudastream.Stream // scrubs the region
	garbage []byte            // NaN bytes, one block
	tok     []int32
	pairs   []transfer.Pair
	events  int // a pass's layer events not complete when it asked for them
}

// newRig builds c on dev with room for passes of up to maxTotal tokens and
// loads of up to maxLoaded; gatherStaging is the copy engine's device
// staging (kvtier.Options.GatherStaging: the server's -gather-staging).
// The caller MUST close it.
func newRig(dev cudastream.Device, c model.Config, maxTotal, maxLoaded int, gatherStaging int64) (r *rig, err error) {
	r = &rig{dev: dev, c: c, slots: c.Blocks(maxTotal)}
	defer func() {
		if err != nil {
			r.close()
			r = nil
		}
	}()
	bb := c.BlockBytes()
	if r.region, err = dev.Alloc(int64(r.slots) * bb); err != nil {
		return r, fmt.Errorf("KV region of %d blocks: %w", r.slots, err)
	}
	if r.m, err = gpu.New(c, 1, r.region, r.slots, gpu.Options{MaxTokens: maxTotal, MaxContext: maxTotal}); err != nil {
		return r, err
	}
	if r.pool, err = dev.HostAlloc(int64(maxLoaded/c.BlockTokens) * bb); err != nil {
		return r, fmt.Errorf("pinned host pool of %d blocks: %w", maxLoaded/c.BlockTokens, err)
	}
	layout, err := transfer.BlockFirstLayout(r.region, c.Layers, 2, r.slots, c.PartBytes())
	if err != nil {
		return r, err
	}
	ec := transfer.Config{GPU: layout, Host: transfer.HostLayout{Pool: r.pool, SlotBytes: bb}}
	if gatherStaging > 0 { // as kvtier/stack sizes it
		ec.GatherBuffers = transfer.DefaultGatherBuffers
		ec.GatherBufferBytes = gatherStaging / (2 * transfer.DefaultGatherBuffers) &^ 4095
	}
	if r.eng, err = transfer.New(dev, ec); err != nil {
		return r, err
	}
	if r.st, err = dev.NewStream(0); err != nil {
		return r, err
	}
	r.garbage = slices.Repeat([]byte{0xff}, int(bb)) // bf16 NaN everywhere
	r.tok = make([]int32, maxTotal)
	for i := range r.tok {
		r.tok[i] = int32((i*7919 + 13) % c.Vocab)
	}
	return r, nil
}

func (r *rig) close() {
	if r.st != nil {
		r.st.Destroy()
	}
	if r.eng != nil {
		r.eng.Close()
	}
	if r.pool != nil {
		r.dev.HostFree(r.pool)
	}
	if r.m != nil {
		r.m.Close()
	}
	if r.region != 0 {
		r.dev.Free(r.region)
	}
}

// fill computes the KV of the first total tokens into the region and
// offloads the first loaded tokens' blocks into the host pool through the
// engine. A position's KV depends only on the tokens up to it, so one fill
// serves every split within it.
func (r *rig) fill(ctx context.Context, total, loaded int) error {
	if _, _, err := r.m.Forward(r.tok[:total], r.plan(split{total, 0})); err != nil {
		return fmt.Errorf("fill %d tokens: %w", total, err)
	}
	tr, err := r.eng.Offload(ctx, r.blockPairs(loaded))
	if err != nil {
		return err
	}
	err = tr.Wait(ctx)
	<-tr.Done()
	tr.Release()
	return err
}

// blockPairs pairs GPU block i with host slot i for the blocks of the first
// loaded tokens.
func (r *rig) blockPairs(loaded int) []transfer.Pair {
	r.pairs = r.pairs[:0]
	for b := range loaded / r.c.BlockTokens {
		r.pairs = append(r.pairs, transfer.Pair{GPUBlock: int32(b), HostSlot: int32(b)})
	}
	return r.pairs
}

// plan computes the positions after s.loaded, every block in its own slot.
func (r *rig) plan(s split) model.Plan {
	p := model.Plan{Slots: make([]int32, r.c.Blocks(s.total))}
	for i := range p.Slots {
		p.Slots[i] = int32(i)
	}
	for q := s.loaded; q < s.total; q++ {
		p.Compute = append(p.Compute, int32(q))
	}
	return p
}

// scrub fills the GPU blocks of s's loaded prefix with NaNs, so that a
// pass that read a layer before its load landed returns NaN logits.
func (r *rig) scrub(s split) error {
	bb := r.c.BlockBytes()
	for b := range s.loaded / r.c.BlockTokens {
		if err := r.st.CopyHtoD(r.region+cudastream.DevicePtr(int64(b)*bb), r.garbage); err != nil {
			return err
		}
	}
	return r.st.Synchronize()
}

// pass runs s's prefill once: the loads through the engine, then at once
// the forward pass, waiting for each layer's loads as w says. It returns
// the time from the onboard's submission to the logits on the host, and a
// copy of the logits. r.events counts the layers not landed yet when the
// pass reached them.
func (r *rig) pass(ctx context.Context, s split, w wait) (time.Duration, []float32, error) {
	p := r.plan(s)
	r.events = 0
	t0 := time.Now()
	tr, err := r.eng.Onboard(ctx, r.blockPairs(s.loaded))
	if err != nil {
		return 0, nil, err
	}
	switch w {
	case hostWait:
		p.Ready = func(l int) error {
			if ok, _ := tr.LayerReady(l); !ok {
				r.events++
			}
			return tr.WaitLayer(ctx, l)
		}
	case deviceWait:
		p.LayerEvents = func(l int, dst []cudastream.Event) ([]cudastream.Event, error) {
			ev := tr.LayerEvent(l)
			if ok, _ := ev.Query(); !ok {
				r.events++
			}
			return append(dst, ev), nil
		}
	}
	logits, _, ferr := r.m.Forward(r.tok[:s.total], p)
	d := time.Since(t0)
	logits = slices.Clone(logits)
	werr := tr.Wait(ctx)
	<-tr.Done()
	tr.Release()
	if ferr != nil {
		return 0, nil, ferr
	}
	if werr != nil {
		return 0, nil, fmt.Errorf("the loads: %w", werr)
	}
	return d, logits, nil
}

// present runs s's pass with its prefix already in the region (no load).
func (r *rig) present(s split) (time.Duration, []float32, error) {
	t0 := time.Now()
	logits, _, err := r.m.Forward(r.tok[:s.total], r.plan(s))
	return time.Since(t0), slices.Clone(logits), err
}

// loadOnly times s's onboard alone, from submission to its completion.
func (r *rig) loadOnly(ctx context.Context, s split) (time.Duration, error) {
	t0 := time.Now()
	tr, err := r.eng.Onboard(ctx, r.blockPairs(s.loaded))
	if err != nil {
		return 0, err
	}
	err = tr.Wait(ctx)
	d := time.Since(t0)
	<-tr.Done()
	tr.Release()
	return d, err
}

// verify runs s's prefill with each wait over a scrubbed prefix and checks
// that the logits equal, bit for bit, those of the same pass with the
// prefix present: no layer was read before its load landed. It returns,
// per wait, the layers that had not landed when the pass reached them.
func (r *rig) verify(ctx context.Context, s split) ([numWaits]int, error) {
	var inFlight [numWaits]int
	_, want, err := r.present(s)
	if err != nil {
		return inFlight, err
	}
	for w := range numWaits {
		if err := r.scrub(s); err != nil {
			return inFlight, err
		}
		_, got, err := r.pass(ctx, s, w)
		if err != nil {
			return inFlight, fmt.Errorf("%v, %v: %w", s, w, err)
		}
		inFlight[w] = r.events
		if i := firstDiff(got, want); i >= 0 {
			return inFlight, fmt.Errorf("%v, %v: logit %d is %v, with the prefix present %v", s, w, i, got[i], want[i])
		}
	}
	return inFlight, nil
}

// firstDiff is the first index where a and b differ (NaN differs from
// everything), or -1.
func firstDiff(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}
