package kvtier

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/pinned"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/transfer"
)

// Options configures Open: the common case of a server with one GPU, or
// several in tensor parallel, a pinned host tier and, optionally, an NVMe
// tier. Sizes are given once and every part gets the ones it needs.
type Options struct {
	// Device is the GPU (cudastream.Open) or the simulated device
	// (cudastream.NewSim). Required unless Shards is set. The host tier's
	// pages are bound to its NUMA node (Device.Info().NUMANode) where the
	// machine has several.
	Device cudastream.Device
	// GPU is the server's KV region: GPU slot s is block s of the layout,
	// so the GPU tier has GPU.NumBlocks slots of GPU.BlockBytes(). Required
	// unless Shards is set.
	GPU transfer.GPULayout
	// Shards makes a tensor-parallel cache over several GPUs, one entry
	// per GPU in rank order, each with its device and its KV region (its
	// share of every block); Device and GPU are then left unset. The
	// regions have the same NumBlocks and BlockBytes. Each GPU gets its
	// own parts, sized by HostBytes and NVMeBytes: a pinned pool bound to
	// its NUMA node (the pools are pinned at the same time), copy engines
	// and a store in a directory "rank<N>" of each NVMeDirs entry (made
	// 0700 if absent). One Manager decides for all of them through a
	// ShardedMover, so a block is cached on every GPU or on none.
	Shards []Shard
	// BlockTokens is the number of tokens per block, for example 16.
	BlockTokens int
	// HostBytes sizes the pinned host tier (per GPU); each slot holds one
	// block rounded up to 4 KiB. Example: 64 GiB of 2.5 MiB blocks is
	// 26,214 slots. Required (the copy engine moves blocks through it).
	HostBytes int64
	// NVMeDirs and NVMeBytes make the NVMe tier: NVMeBytes of blocks (per
	// GPU) spread over one slab file per directory (which must exist).
	// Both or neither.
	NVMeDirs  []string
	NVMeBytes int64
	// KeepNVMe keeps the blocks a previous run left in NVMeDirs and adopts
	// them (see DeviceMoverConfig.KeepBlocks); otherwise they are freed.
	// Not with Shards yet: adopting a block needs every rank's part of it
	// in the same slot, which the stores do not record.
	KeepNVMe bool
	// WriteThrough: see Config.WriteThrough.
	WriteThrough bool
	// MaxHoleBlocks: see Config.MaxHoleBlocks (0: a lookup stops at the
	// first missing block).
	MaxHoleBlocks int
	// GatherStaging is the device memory (per GPU) of the copy engine's
	// gather/scatter path (transfer.MethodGather, which MethodAuto takes
	// where a transfer's host slots are consecutive, so that its blocks
	// cross the link in a few large or strided DMAs): split into
	// transfer.DefaultGatherBuffers buffers per direction. 0 means none.
	// The H200 measurements used 96 MiB (buffers of 16 MiB).
	GatherStaging int64
	// Policy makes tier t's eviction policy for its slot count. Nil means
	// policy.NewDenseLRU for every tier.
	Policy func(t Tier, slots int) (policy.Policy[BlockRef], error)
	// Planner: see Config.Planner (nil: LoadAll).
	Planner Planner
	// Logger receives what Open and Close do (sizes, recovered blocks,
	// failures on shutdown). Nil means slog.Default(). Nothing is logged on
	// a request's path.
	Logger *slog.Logger
}

// Shard is one GPU of a tensor-parallel cache: see Options.Shards.
type Shard struct {
	Device cudastream.Device
	GPU    transfer.GPULayout
}

// Cache is a Manager wired to its parts by Open. The parts stay reachable
// for what the Manager does not do (stats, tuning); Close closes them.
// Its GPUParts are the first GPU's (rank 0); Ranks has every GPU's.
type Cache struct {
	*Manager
	*GPUParts
	// Ranks are the parts of each GPU in rank order: one entry without
	// tensor parallelism, Ranks[0] being the embedded GPUParts.
	Ranks []*GPUParts

	log      *slog.Logger
	growCtx  context.Context
	stopGrow context.CancelFunc
	growing  sync.WaitGroup
	pinned   chan struct{} // closed when growHost has registered every chunk
	pinErr   error         // why it stopped short (before pinned is closed)
}

// WaitHostPinned blocks until every host slot is registered (Open returns
// after the first chunk), and returns the registration's error if it
// stopped short, or ctx's. A server that must not serve during the
// registration waits for it: on the H200 test machine, GPU work submitted
// while 32 GiB of cold memory were being pinned (9.4 s) stalled, the first
// requests' time to first token rising from 0.85 s to 8.2 s.
func (c *Cache) WaitHostPinned(ctx context.Context) error {
	select {
	case <-c.pinned:
		return c.pinErr
	case <-ctx.Done():
		return fmt.Errorf("kvtier: WaitHostPinned: %w", ctx.Err())
	}
}

// GPUParts are what Open builds for one GPU.
type GPUParts struct {
	// Engine moves blocks between the GPU and the host tier; Bounce
	// carries GPU-to-NVMe copies through a few pinned slots.
	Engine, Bounce *transfer.Engine
	// Mover moves this GPU's blocks: the Manager's Mover with one GPU, a
	// shard of its ShardedMover with several.
	Mover *DeviceMover
	// Store is the NVMe tier, nil without one.
	Store *nvme.Store
	// Host is the host tier's pinned slots: Host.Slot(s) is host slot s.
	Host transfer.HostLayout

	pool                *pinned.Region
	hostBase, slotBytes int64 // the host tier's offset in pool, its slot size
}

// readyHostSlots is how many host slots are registered now.
func (p *GPUParts) readyHostSlots() int {
	return int(max(0, p.pool.ReadyBytes()-p.hostBase) / p.slotBytes)
}

// usableHostSlots is how many host slots every GPU has registered: a host
// slot holds a part of its block on each GPU's pool.
func (c *Cache) usableHostSlots() int {
	n := c.Ranks[0].readyHostSlots()
	for _, p := range c.Ranks[1:] {
		n = min(n, p.readyHostSlots())
	}
	return n
}

// growHost raises the host tier's usable slots as the pools' chunks are
// registered, until all are or Close stops it.
func (c *Cache) growHost(start time.Time) {
	defer c.growing.Done()
	defer close(c.pinned)
	size, chunk := c.Ranks[0].pool.Size(), c.Ranks[0].pool.ChunkBytes()
	for next := chunk; ; next += chunk {
		next = min(next, size)
		for r, p := range c.Ranks {
			if err := p.pool.WaitReady(c.growCtx, next); err != nil {
				c.pinErr = fmt.Errorf("kvtier: the host tier stopped at %d slots: %w", c.usableHostSlots(), err)
				if c.growCtx.Err() == nil {
					c.log.Error("kvtier: pinning the host tier failed: it keeps the slots pinned so far",
						"rank", r, "slots", c.usableHostSlots(), "err", err)
				}
				return
			}
		}
		_ = c.SetUsableSlots(Host, c.usableHostSlots())
		if next == size {
			for r, p := range c.Ranks {
				c.log.Info("kvtier: host tier pinned", "rank", r, "bytes", next, "slots", p.readyHostSlots(), "slot_bytes", p.slotBytes,
					"seconds", time.Since(start).Seconds(), "numa", p.pool.Stats().NUMANote)
			}
			return
		}
	}
}

// openStagingSlots and openBounceSlots size the pinned buffers besides the
// host tier: two staging buffers of two slots for NVMe loads, and four
// bounce slots for GPU-to-NVMe copies.
const openStagingSlots, openBounceSlots = 2, 4

// openChunkBytes is the pinned pool's registration unit (0: pinned's
// default); tests make it small to put registration boundaries inside a
// small host tier.
var openChunkBytes int64

// Open checks o, allocates the pinned host memory and starts registering it,
// and builds the copy engines, the NVMe store, the DeviceMover and the
// Manager with sizes that agree (for each GPU, with Shards). It returns once
// the first chunk is registered: the host tier serves from the slots
// registered so far and grows as the rest is (Manager.SetUsableSlots), so a
// server with hundreds of GiB of host tier starts in a second. On error
// everything built so far is closed again.
func Open(ctx context.Context, o Options) (*Cache, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	bad := func(field, format string, args ...any) (*Cache, error) {
		return nil, configErr("Options."+field, format, args...)
	}
	shards := o.Shards
	switch {
	case len(shards) > 0 && (o.Device != nil || o.GPU.NumBlocks != 0):
		return bad("Shards", "%d shards with Options.Device or Options.GPU set: give one or the other", len(shards))
	case len(shards) > 0 && o.KeepNVMe:
		return bad("KeepNVMe", "with %d shards: adopting NVMe blocks is not supported for tensor parallelism yet", len(shards))
	case len(shards) == 0 && o.Device == nil:
		return bad("Device", "is nil")
	case o.BlockTokens <= 0 || o.BlockTokens > MaxBlockTokens:
		return bad("BlockTokens", "%d is not in [1, %d]", o.BlockTokens, MaxBlockTokens)
	case o.HostBytes <= 0:
		return bad("HostBytes", "%d is not positive", o.HostBytes)
	case (len(o.NVMeDirs) == 0) != (o.NVMeBytes == 0):
		return bad("NVMeBytes", "%d with %d NVMeDirs: give both or neither", o.NVMeBytes, len(o.NVMeDirs))
	case o.NVMeBytes < 0:
		return bad("NVMeBytes", "%d is negative", o.NVMeBytes)
	case o.MaxHoleBlocks < 0:
		return bad("MaxHoleBlocks", "%d is negative", o.MaxHoleBlocks)
	case o.GatherStaging < 0:
		return bad("GatherStaging", "%d is negative", o.GatherStaging)
	}
	if len(shards) == 0 {
		shards = []Shard{{Device: o.Device, GPU: o.GPU}}
		if err := o.GPU.Validate(); err != nil {
			return bad("GPU", "%v", err)
		}
	}
	for r, sh := range shards {
		field := fmt.Sprintf("Shards[%d]", r)
		if sh.Device == nil {
			return bad(field+".Device", "is nil")
		}
		if err := sh.GPU.Validate(); err != nil {
			return bad(field+".GPU", "%v", err)
		}
		if r > 0 && (sh.GPU.NumBlocks != shards[0].GPU.NumBlocks || sh.GPU.BlockBytes() != shards[0].GPU.BlockBytes()) {
			return bad(field+".GPU", "%d blocks of %d bytes, but Shards[0] has %d of %d: every GPU holds its part of the same blocks",
				sh.GPU.NumBlocks, sh.GPU.BlockBytes(), shards[0].GPU.NumBlocks, shards[0].GPU.BlockBytes())
		}
	}
	blockBytes := shards[0].GPU.BlockBytes()
	slotBytes := (blockBytes + 4095) &^ 4095
	hostSlots := o.HostBytes / slotBytes
	if hostSlots == 0 {
		return bad("HostBytes", "%d holds no slot of %d bytes (a %d-byte block rounded up to 4 KiB)", o.HostBytes, slotBytes, blockBytes)
	}
	nvmeSlots := o.NVMeBytes / blockBytes
	if o.NVMeBytes > 0 && nvmeSlots == 0 {
		return bad("NVMeBytes", "%d holds no block of %d bytes", o.NVMeBytes, blockBytes)
	}
	newPolicy := o.Policy
	if newPolicy == nil {
		newPolicy = func(_ Tier, n int) (policy.Policy[BlockRef], error) { return policy.NewDenseLRU[BlockRef](n) }
	}

	c := &Cache{log: log}
	fail := func(err error) (*Cache, error) {
		if cerr := c.closeParts(); cerr != nil {
			log.Warn("kvtier: Open: closing after a failure", "err", cerr)
		}
		return nil, fmt.Errorf("kvtier: Open: %w", err)
	}
	start := time.Now()
	// Every GPU's pool starts registering (in the background) before the
	// first is waited for, so that they are pinned at the same time.
	for r, sh := range shards {
		p, err := allocHost(ctx, sh.Device, hostSlots, slotBytes)
		if p != nil {
			c.Ranks = append(c.Ranks, p)
		}
		if err != nil {
			return fail(fmt.Errorf("host tier of rank %d: %w", r, err))
		}
	}
	c.GPUParts = c.Ranks[0]
	for r, sh := range shards {
		dirs := o.NVMeDirs
		if len(shards) > 1 && nvmeSlots > 0 {
			dirs = make([]string, len(o.NVMeDirs))
			for i, d := range o.NVMeDirs {
				dirs[i] = filepath.Join(d, fmt.Sprintf("rank%d", r))
				if err := os.Mkdir(dirs[i], 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
					return fail(fmt.Errorf("NVMe directory of rank %d: %w", r, err))
				}
			}
		}
		if err := c.Ranks[r].build(ctx, sh, o, dirs, blockBytes, int(nvmeSlots)); err != nil {
			if len(shards) > 1 {
				err = fmt.Errorf("rank %d: %w", r, err)
			}
			return fail(err)
		}
	}

	cfg := Config{BlockTokens: o.BlockTokens, WriteThrough: o.WriteThrough, MaxHoleBlocks: o.MaxHoleBlocks, Mover: c.Mover, Planner: o.Planner}
	if len(shards) > 1 {
		movers := make([]Mover, len(c.Ranks))
		for r, p := range c.Ranks {
			movers[r] = p.Mover
		}
		sm, err := NewShardedMover(movers...)
		if err != nil {
			return fail(err)
		}
		cfg.Mover = sm
	}
	sizes := [NumTiers]struct{ slots, slotBytes int64 }{
		GPU: {int64(shards[0].GPU.NumBlocks), blockBytes}, Host: {hostSlots, slotBytes}, NVMe: {nvmeSlots, blockBytes}}
	for t := range NumTiers {
		if sizes[t].slots == 0 {
			continue
		}
		p, err := newPolicy(t, int(sizes[t].slots))
		if err != nil {
			return fail(fmt.Errorf("policy of the %v tier: %w", t, err))
		}
		cfg.Tiers[t] = TierConfig{CapacityBytes: sizes[t].slots * sizes[t].slotBytes, SlotBytes: sizes[t].slotBytes, Policy: p}
	}
	var err error
	if c.Manager, err = New(cfg); err != nil {
		return fail(err)
	}
	if rec := c.Mover.Recovered(); len(rec) > 0 {
		n, err := c.Adopt(NVMe, rec)
		if err != nil {
			return fail(err)
		}
		log.Info("kvtier: adopted the blocks a previous run left on NVMe", "blocks", n, "found", len(rec))
	}
	c.growCtx, c.stopGrow = context.WithCancel(context.Background())
	if err := c.SetUsableSlots(Host, c.usableHostSlots()); err != nil {
		return fail(err)
	}
	c.pinned = make(chan struct{})
	c.growing.Add(1)
	go c.growHost(start)
	log.Info("kvtier: open", "gpus", len(shards), "gpu_slots", shards[0].GPU.NumBlocks, "host_slots", hostSlots, "nvme_slots", nvmeSlots,
		"block_bytes", blockBytes, "write_through", o.WriteThrough)
	return c, nil
}

// allocHost allocates one GPU's pinned memory, bound to its NUMA node, and
// starts registering it in the background: the staging and bounce slots
// come first, the host tier after them, so that the host tier can serve
// from the slots registered so far (SetUsableSlots) while the rest is
// pinned.
func allocHost(ctx context.Context, dev cudastream.Device, hostSlots, slotBytes int64) (*GPUParts, error) {
	extra := int64(openStagingSlots*2+openBounceSlots) * slotBytes
	pool, err := pinned.Alloc(ctx, extra+hostSlots*slotBytes, pinned.Options{
		Registrar:     dev,
		ChunkMultiple: slotBytes,
		ChunkBytes:    openChunkBytes,
		NUMANodes:     []int{dev.Info().NUMANode},
		Background:    true,
	})
	if err != nil {
		return nil, err
	}
	return &GPUParts{pool: pool, hostBase: extra, slotBytes: slotBytes}, nil
}

// build waits for p's staging and bounce slots to be registered and builds
// the GPU's copy engines, its NVMe store in dirs (nvmeSlots > 0) and its
// DeviceMover.
func (p *GPUParts) build(ctx context.Context, sh Shard, o Options, dirs []string, blockBytes int64, nvmeSlots int) error {
	extra, slotBytes := p.hostBase, p.slotBytes
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
			return configErr("Options.GatherStaging", "%d bytes make no buffer of 4 KiB (%d per direction)", o.GatherStaging, transfer.DefaultGatherBuffers)
		}
	}
	// With an NVMe tier, the engines checksum its payloads on the GPU
	// (transfer.Config.Sums, DeviceMover's doc), where the device can.
	bc := transfer.Config{GPU: sh.GPU, Host: bounceHost, Now: now}
	ec.Sums, bc.Sums = nvmeSlots > 0, nvmeSlots > 0
	if p.Engine, err = newEngine(sh.Device, ec); err != nil {
		if o.GatherStaging > 0 {
			return fmt.Errorf("Options.GatherStaging %d: %w", o.GatherStaging, err)
		}
		return err
	}
	if p.Bounce, err = newEngine(sh.Device, bc); err != nil {
		return err
	}
	mc := DeviceMoverConfig{Engine: p.Engine, Host: p.Host, BlockBytes: blockBytes, Bounce: p.Bounce, BounceHost: bounceHost,
		StoreTokens: true, KeepBlocks: o.KeepNVMe}
	if nvmeSlots > 0 {
		perFile := (nvmeSlots + len(dirs) - 1) / len(dirs)
		p.Store, err = nvme.Open(nvme.Config{Dirs: dirs, SlotsPerFile: perFile, BlockBytes: int(blockBytes), MaxTokens: o.BlockTokens})
		if err != nil {
			return err
		}
		mc.Store, mc.NVMeSlots = p.Store, nvmeSlots
	}
	p.Mover, err = NewDeviceMover(mc)
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

// Close waits for every copy in flight (Drain), then closes the mover, the
// copy engines, the NVMe store and the pinned host memory, in that order.
// The Manager MUST NOT be used during or after Close.
func (c *Cache) Close() error {
	var errs []error
	if c.stopGrow != nil {
		c.stopGrow()
		c.growing.Wait()
	}
	if c.Manager != nil {
		if err := c.Drain(context.Background()); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, c.closeParts())
	err := errors.Join(errs...)
	if err != nil {
		c.log.Warn("kvtier: close", "err", err)
	}
	return err
}

// closeParts closes what Open built, most dependent first.
func (c *Cache) closeParts() error {
	var errs []error
	for _, p := range c.Ranks {
		errs = append(errs, p.close())
	}
	return errors.Join(errs...)
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
