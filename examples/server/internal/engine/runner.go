package engine

import (
	"fmt"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/gpu"
	"kvtier.dev/examples/server/internal/model"
)

// GPURunner runs the model on the GPU, over the KV region kvtier copies
// into: blocks from the cache need nothing more than Plan.Ready.
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
type CPURunner struct {
	m      *model.CPU
	dev    cudastream.Device
	st     cudastream.Stream
	region cudastream.DevicePtr
	// cacheSlots: slots at and above it are the engine's scratch, which
	// kvtier never copies: they stay in the model's memory.
	cacheSlots int32
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
	ready := p.Ready
	p.Ready = func(l int) error {
		if ready != nil {
			if err := ready(l); err != nil {
				return err
			}
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
	}
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
