package stack

import (
	"context"
	"errors"
	"fmt"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/devmover"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/pinned"
	"kvtier.dev/kvtier/transfer"
)

// GPUParts are what Open builds for one GPU.
type GPUParts struct {
	// Engine moves blocks between the GPU and the host tier; Bounce
	// carries GPU-to-NVMe copies through a few pinned slots.
	Engine, Bounce *transfer.Engine
	// Mover moves this GPU's blocks: the Manager's Mover with one GPU, a
	// shard of its ShardedMover with several.
	Mover *devmover.Mover
	// Store is the NVMe tier, nil without one.
	Store *nvme.Store
	// Host is the host tier's pinned slots: Host.Slot(s) is host slot s.
	Host transfer.HostLayout

	pool                *pinned.Region
	hostBase, slotBytes int64 // the host tier's offset in pool, its slot size
}

// Pool is the pinned region behind this GPU's host tier, staging and
// bounce slots (its Stats: kvprom.Pinned).
func (p *GPUParts) Pool() *pinned.Region { return p.pool }

// readyHostSlots is how many host slots are registered now.
func (p *GPUParts) readyHostSlots() int {
	return int(max(0, p.pool.ReadyBytes()-p.hostBase) / p.slotBytes)
}

// stagingSlots and bounceSlots size the pinned buffers besides the host
// tier: two staging buffers of two slots for NVMe loads, and four bounce
// slots for GPU-to-NVMe copies.
const stagingSlots, bounceSlots = 2, 4

// chunkBytes is the pinned pool's registration unit (0: pinned's default);
// tests make it small to put registration boundaries inside a small host
// tier.
var chunkBytes int64

// allocHost allocates one GPU's pinned memory, bound to its NUMA node, and
// starts registering it in the background: the staging and bounce slots
// come first, the host tier after them, so that the host tier can serve
// from the slots registered so far (SetUsableSlots) while the rest is
// pinned.
func allocHost(ctx context.Context, dev cudastream.Device, hostSlots, slotBytes int64) (*GPUParts, error) {
	extra := int64(stagingSlots*2+bounceSlots) * slotBytes
	pool, err := pinned.Alloc(ctx, extra+hostSlots*slotBytes, pinned.Options{
		Registrar:     dev,
		ChunkMultiple: slotBytes,
		ChunkBytes:    chunkBytes,
		NUMANodes:     []int{dev.Info().NUMANode},
		Background:    true,
	})
	if err != nil {
		return nil, err
	}
	return &GPUParts{pool: pool, hostBase: extra, slotBytes: slotBytes}, nil
}

// build waits for p's staging and bounce slots to be registered and builds
// the GPU's copy engines, its NVMe store in dirs (with s.nvmeSlots) and its
// DeviceMover.
func (p *GPUParts) build(ctx context.Context, sh Shard, o *Options, s *sizes, dirs []string) error {
	extra, slotBytes := p.hostBase, p.slotBytes
	blockBytes, nvmeSlots := s.storedBytes, int(s.nvmeSlots)
	if err := p.pool.WaitReady(ctx, extra); err != nil {
		return fmt.Errorf("host tier: %w", err)
	}
	mem := p.pool.Bytes()
	reg := p.pool.ChunkBytes()
	staging := [][]byte{mem[:2*slotBytes], mem[2*slotBytes : 4*slotBytes]}
	// A slot of the pool never straddles a registration: the region's
	// chunks are multiples of slotBytes from its start. The bounce slots
	// and the host tier start inside the first chunk, so their layouts say
	// where: the copy engine then never coalesces a copy across a chunk
	// boundary (the driver refuses one that spans two registrations).
	bounceHost := transfer.HostLayout{Pool: mem[4*slotBytes : extra], SlotBytes: slotBytes,
		RegistrationBytes: reg, RegistrationOffset: (4 * slotBytes) % reg}
	p.Host = transfer.HostLayout{Pool: mem[extra:p.pool.Size()], SlotBytes: slotBytes,
		RegistrationBytes: reg, RegistrationOffset: extra % reg}

	var now func() time.Duration
	if sim, ok := sh.Device.(*cudastream.Sim); ok {
		now = sim.Clock().Now
	}
	var err error
	ec := transfer.Config{GPU: sh.GPU, Host: p.Host, Staging: staging, Now: now}
	if o.GatherStaging > 0 {
		ec.GatherBuffers = transfer.DefaultGatherBuffers
		ec.GatherBufferBytes = o.GatherStaging / (2 * transfer.DefaultGatherBuffers) &^ 4095
		if ec.GatherBufferBytes == 0 {
			return optionErr("GatherStaging", "%d bytes make no buffer of 4 KiB (%d per direction)", o.GatherStaging, transfer.DefaultGatherBuffers)
		}
	}
	// With an NVMe tier, the engines checksum its payloads on the GPU
	// (transfer.Config.Sums, devmover.Mover), where the device can.
	bc := transfer.Config{GPU: sh.GPU, Host: bounceHost, Now: now}
	// With a codec the engines code blocks on the GPU; their sums would
	// be of the GPU's bytes, so the store checksums payloads on the CPU.
	ec.Sums, bc.Sums = nvmeSlots > 0 && !o.Codecs.enabled(), nvmeSlots > 0 && !o.Codecs.enabled()
	if err := engineCodec(&ec, o.Codecs.Host, s.shape); err != nil {
		return err
	}
	if err := engineCodec(&bc, o.Codecs.Host, s.shape); err != nil {
		return err
	}
	if bc.Codec != codec.None { // offloads of a few blocks to NVMe: one small buffer
		bc.CodecBuffers, bc.CodecChunkBlocks = 1, bounceSlots
	}
	if ec.Codec != codec.None {
		ec.OnCodecKernel, bc.OnCodecKernel = o.OnCodecKernel, o.OnCodecKernel
	}
	if p.Engine, err = newEngine(sh.Device, ec); err != nil {
		if o.GatherStaging > 0 {
			return fmt.Errorf("Options.GatherStaging %d: %w", o.GatherStaging, err)
		}
		return err
	}
	if p.Bounce, err = newEngine(sh.Device, bc); err != nil {
		return err
	}
	mc := devmover.Config{Engine: p.Engine, Host: p.Host, BlockBytes: blockBytes, Bounce: p.Bounce, BounceHost: bounceHost,
		StoreTokens: true, KeepBlocks: o.KeepNVMe, OnDriveIO: o.OnDriveIO, Codec: o.Codecs.NVMe}
	if nvmeSlots > 0 {
		perFile := (nvmeSlots + len(dirs) - 1) / len(dirs)
		p.Store, err = nvme.Open(nvme.Config{Dirs: dirs, SlotsPerFile: perFile, BlockBytes: int(blockBytes), MaxTokens: o.BlockTokens,
			Model: o.Model.String(), Reformat: o.NVMeReformat})
		if errors.Is(err, nvme.ErrConfig) || errors.Is(err, nvme.ErrUnsafeDir) {
			return fmt.Errorf("%w (Options.NVMeReformat empties and reformats a slab file the tier cannot use)", err)
		}
		if err != nil {
			return err
		}
		mc.Store, mc.NVMeSlots = p.Store, nvmeSlots
	}
	p.Mover, err = devmover.New(mc)
	return err
}

// newEngine is transfer.New, without Config.Sums where the device cannot
// sum (a TimingOnly simulator) or the layout's parts are not whole words:
// the store then checksums payloads on the CPU.
func newEngine(dev cudastream.Device, cfg transfer.Config) (*transfer.Engine, error) {
	if cfg.Sums && cfg.GPU.PartBytes%8 != 0 {
		cfg.Sums = false
	}
	e, err := transfer.New(dev, cfg)
	if cfg.Sums && errors.Is(err, cudastream.ErrNotSupported) {
		cfg.Sums = false
		e, err = transfer.New(dev, cfg)
	}
	return e, err
}

// close closes p's parts, most dependent first.
func (p *GPUParts) close() error {
	var errs []error
	if p.Mover != nil {
		errs = append(errs, p.Mover.Close())
	}
	for _, e := range []*transfer.Engine{p.Engine, p.Bounce} {
		if e != nil {
			errs = append(errs, e.Close())
		}
	}
	if p.Store != nil {
		errs = append(errs, p.Store.Close())
	}
	if p.pool != nil {
		errs = append(errs, p.pool.Close())
	}
	return errors.Join(errs...)
}
