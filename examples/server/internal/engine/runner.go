package engine

import (
	"fmt"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/gpu"
	"kvtier.dev/examples/server/internal/model"
)

// GPURunner runs the model on the GPU, over the KV region kvtier copies
// into: blocks from the cache need nothing more than Plan.LayerEvents (the
// GPU's stream waits on them) or Plan.Ready.
type GPURunner struct{ M *gpu.Model }

// Forward implements Runner.
func (r GPURunner) Forward(tokens []int32, p model.Plan, _ []int32) ([]float32, int32, error) {
	return r.M.Forward(tokens, p)
}

// CPURunner runs the CPU reference model for a server on the simulated
// device: kvtier's copies move blocks in and out of the device's region,
// the model computes in its own host copy of it (model.CPU.Region), and the
// runner keeps the two in step. Before layer l reads them it copies layer
// l of the blocks kvtier provides from the device; after the pass it copies
// the blocks it computed to the device, before the engine commits them.
// With Plan.LayerEvents its copy stream waits on the layer's events on the
// device, as the GPU's compute stream does, before that copy (the model
// then waits on the host for the copy); without them it calls Plan.Ready.
type CPURunner struct {
	m      *model.CPU
	dev    cudastream.Device
	st     cudastream.Stream
	region cudastream.DevicePtr
	// cacheSlots: slots at and above it are the engine's scratch, which
	// kvtier never copies: they stay in the model's memory.
	cacheSlots int32
	events     []cudastream.Event // Plan.LayerEvents scratch
}

// NewCPURunner returns a runner of m whose device region is region on dev,
// of the same slots as m.Region(); the first cacheSlots are the cache's.
func NewCPURunner(m *model.CPU, dev cudastream.Device, region cudastream.DevicePtr, cacheSlots int) (*CPURunner, error) {
	st, err := dev.NewStream(0)
	if err != nil {
		return nil, fmt.Errorf("engine: CPU runner: %w", err)
	}
	return &CPURunner{m: m, dev: dev, st: st, region: region, cacheSlots: int32(cacheSlots)}, nil
}

// Close destroys the runner's stream.
func (r *CPURunner) Close() error { return r.st.Destroy() }

// Forward implements Runner.
func (r *CPURunner) Forward(tokens []int32, p model.Plan, fromCache []int32) ([]float32, int32, error) {
	c := r.m.Config()
	bb, lb := c.BlockBytes(), 2*c.PartBytes() // a layer's K and V are adjacent in a block
	ready, events := p.Ready, p.LayerEvents
	p.Ready, p.LayerEvents = func(l int) error {
		if err := r.waitLayer(ready, events, l); err != nil {
			return err
		}
		if len(fromCache) == 0 {
			return nil
		}
		for _, s := range fromCache {
			off := int64(s)*bb + int64(l)*lb
			if err := r.st.CopyDtoH(r.m.Region()[off:off+lb], r.region+cudastream.DevicePtr(off)); err != nil {
				return fmt.Errorf("engine: read layer %d of slot %d from the device: %w", l, s, err)
			}
		}
		return r.st.Synchronize()
	}, nil
	logits, next, err := r.m.Forward(tokens, p)
	if err != nil {
		return nil, 0, err
	}
	// Write back the cache's blocks this pass computed into.
	last := int32(-1)
	for _, q := range p.Compute {
		s := p.Slots[int(q)/c.BlockTokens]
		if s == last || s >= r.cacheSlots {
			continue
		}
		last = s
		off := int64(s) * bb
		if err := r.st.CopyHtoD(r.region+cudastream.DevicePtr(off), r.m.Region()[off:off+bb]); err != nil {
			return nil, 0, fmt.Errorf("engine: write slot %d to the device: %w", s, err)
		}
	}
	if err := r.st.Synchronize(); err != nil {
		return nil, 0, err
	}
	return logits, next, nil
}

// waitLayer orders the runner's copies of layer l after its loads: on the
// device (the stream waits on the events of layer l) or else on the host
// (ready).
func (r *CPURunner) waitLayer(ready func(int) error, events func(int, []cudastream.Event) ([]cudastream.Event, error), l int) error {
	if events == nil {
		if ready == nil {
			return nil
		}
		return ready(l)
	}
	var err error
	if r.events, err = events(l, r.events[:0]); err != nil {
		return err
	}
	for i, ev := range r.events {
		if err := r.st.WaitEvent(ev); err != nil {
			return fmt.Errorf("engine: layer %d: wait on event %d: %w", l, i, err)
		}
	}
	clear(r.events)
	return nil
}
