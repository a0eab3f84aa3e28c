package kvtier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/pinned"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/transfer"
)

// Options configures Open: the common case of a server with one GPU, a
// pinned host tier and, optionally, an NVMe tier. Sizes are given once and
// every part gets the ones it needs.
type Options struct {
	// Device is the GPU (cudastream.Open) or the simulated device
	// (cudastream.NewSim). Required. The host tier's pages are bound to its
	// NUMA node (Device.Info().NUMANode) where the machine has several.
	Device cudastream.Device
	// GPU is the server's KV region: GPU slot s is block s of the layout,
	// so the GPU tier has GPU.NumBlocks slots of GPU.BlockBytes(). Required.
	GPU transfer.GPULayout
	// BlockTokens is the number of tokens per block, for example 16.
	BlockTokens int
	// HostBytes sizes the pinned host tier; each slot holds one block
	// rounded up to 4 KiB. Example: 64 GiB of 2.5 MiB blocks is 26,214
	// slots. Required (the copy engine moves blocks through it).
	HostBytes int64
	// NVMeDirs and NVMeBytes make the NVMe tier: NVMeBytes of blocks
	// spread over one slab file per directory (which must exist). Both or
	// neither.
	NVMeDirs  []string
	NVMeBytes int64
	// KeepNVMe keeps the blocks a previous run left in NVMeDirs and adopts
	// them (see DeviceMoverConfig.KeepBlocks); otherwise they are freed.
	KeepNVMe bool
	// WriteThrough: see Config.WriteThrough.
	WriteThrough bool
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

// Cache is a Manager wired to its parts by Open. The parts stay reachable
// for what the Manager does not do (stats, tuning); Close closes them.
type Cache struct {
	*Manager
	// Engine moves blocks between the GPU and the host tier; Bounce
	// carries GPU-to-NVMe copies through a few pinned slots.
	Engine, Bounce *transfer.Engine
	// Mover is the Manager's Mover.
	Mover *DeviceMover
	// Store is the NVMe tier, nil without one.
	Store *nvme.Store
	// Host is the host tier's pinned slots: Host.Slot(s) is host slot s.
	Host transfer.HostLayout

	pool                *pinned.Region
	hostBase, slotBytes int64 // the host tier's offset in pool, its slot size
	log                 *slog.Logger
	growCtx             context.Context
	stopGrow            context.CancelFunc
	growing             sync.WaitGroup
}

// readyHostSlots is how many host slots are registered now.
func (c *Cache) readyHostSlots() int {
	return int(max(0, c.pool.ReadyBytes()-c.hostBase) / c.slotBytes)
}

// growHost raises the host tier's usable slots as the pool's chunks are
// registered, until all are or Close stops it.
func (c *Cache) growHost(start time.Time) {
	defer c.growing.Done()
	for next := c.pool.ChunkBytes(); ; next += c.pool.ChunkBytes() {
		next = min(next, c.pool.Size())
		if err := c.pool.WaitReady(c.growCtx, next); err != nil {
			if c.growCtx.Err() == nil {
				c.log.Error("kvtier: pinning the host tier failed: it keeps the slots pinned so far",
					"slots", c.readyHostSlots(), "err", err)
			}
			return
		}
		_ = c.SetUsableSlots(Host, c.readyHostSlots())
		if next == c.pool.Size() {
			c.log.Info("kvtier: host tier pinned", "bytes", next, "slots", c.readyHostSlots(), "slot_bytes", c.slotBytes,
				"seconds", time.Since(start).Seconds(), "numa", c.pool.Stats().NUMANote)
			return
		}
	}
}

// openStagingSlots and openBounceSlots size the pinned buffers besides the
// host tier: two staging buffers of two slots for NVMe loads, and four
// bounce slots for GPU-to-NVMe copies.
const openStagingSlots, openBounceSlots = 2, 4

// Open checks o, allocates the pinned host memory and starts registering it,
// and builds the copy engines, the NVMe store, the DeviceMover and the
// Manager with sizes that agree. It returns once the first chunk is
// registered: the host tier serves from the slots registered so far and
// grows as the rest is (Manager.SetUsableSlots), so a server with hundreds
// of GiB of host tier starts in a second. On error everything built so far
// is closed again.
func Open(ctx context.Context, o Options) (*Cache, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	bad := func(field, format string, args ...any) (*Cache, error) {
		return nil, configErr("Options."+field, format, args...)
	}
	switch {
	case o.Device == nil:
		return bad("Device", "is nil")
	case o.BlockTokens <= 0 || o.BlockTokens > MaxBlockTokens:
		return bad("BlockTokens", "%d is not in [1, %d]", o.BlockTokens, MaxBlockTokens)
	case o.HostBytes <= 0:
		return bad("HostBytes", "%d is not positive", o.HostBytes)
	case (len(o.NVMeDirs) == 0) != (o.NVMeBytes == 0):
		return bad("NVMeBytes", "%d with %d NVMeDirs: give both or neither", o.NVMeBytes, len(o.NVMeDirs))
	case o.NVMeBytes < 0:
		return bad("NVMeBytes", "%d is negative", o.NVMeBytes)
	}
	if err := o.GPU.Validate(); err != nil {
		return bad("GPU", "%v", err)
	}
	blockBytes := o.GPU.BlockBytes()
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
	// The staging and bounce slots come first, the host tier after them:
	// the region is registered in order, in the background, and the host
	// tier serves from the slots registered so far (SetUsableSlots) while
	// the rest is pinned.
	extra := int64(openStagingSlots*2+openBounceSlots) * slotBytes
	total := extra + hostSlots*slotBytes
	start := time.Now()
	var err error
	c.pool, err = pinned.Alloc(ctx, total, pinned.Options{
		Registrar:     o.Device,
		ChunkMultiple: slotBytes,
		NUMANodes:     []int{o.Device.Info().NUMANode},
		Background:    true,
	})
	if err != nil {
		return fail(fmt.Errorf("host tier: %w", err))
	}
	if err := c.pool.WaitReady(ctx, extra); err != nil {
		return fail(fmt.Errorf("host tier: %w", err))
	}
	mem := c.pool.Bytes()
	reg := c.pool.ChunkBytes()
	staging := [][]byte{mem[:2*slotBytes], mem[2*slotBytes : 4*slotBytes]}
	bounceHost := transfer.HostLayout{Pool: mem[4*slotBytes : extra], SlotBytes: slotBytes}
	// A slot of the pool never straddles a registration: the region's
	// chunks are multiples of slotBytes from its start, and so from extra.
	c.Host = transfer.HostLayout{Pool: mem[extra:total], SlotBytes: slotBytes, RegistrationBytes: reg}
	c.hostBase, c.slotBytes = extra, slotBytes

	var now func() time.Duration
	if sim, ok := o.Device.(*cudastream.Sim); ok {
		now = sim.Clock().Now
	}
	if c.Engine, err = transfer.New(o.Device, transfer.Config{GPU: o.GPU, Host: c.Host, Staging: staging, Now: now}); err != nil {
		return fail(err)
	}
	if c.Bounce, err = transfer.New(o.Device, transfer.Config{GPU: o.GPU, Host: bounceHost, Now: now}); err != nil {
		return fail(err)
	}
	mc := DeviceMoverConfig{Engine: c.Engine, Host: c.Host, BlockBytes: blockBytes, Bounce: c.Bounce, BounceHost: bounceHost,
		StoreTokens: true, KeepBlocks: o.KeepNVMe}
	if nvmeSlots > 0 {
		perFile := (int(nvmeSlots) + len(o.NVMeDirs) - 1) / len(o.NVMeDirs)
		c.Store, err = nvme.Open(nvme.Config{Dirs: o.NVMeDirs, SlotsPerFile: perFile, BlockBytes: int(blockBytes), MaxTokens: o.BlockTokens})
		if err != nil {
			return fail(err)
		}
		mc.Store, mc.NVMeSlots = c.Store, int(nvmeSlots)
	}
	if c.Mover, err = NewDeviceMover(mc); err != nil {
		return fail(err)
	}

	cfg := Config{BlockTokens: o.BlockTokens, WriteThrough: o.WriteThrough, Mover: c.Mover, Planner: o.Planner}
	sizes := [NumTiers]struct{ slots, slotBytes int64 }{
		GPU: {int64(o.GPU.NumBlocks), blockBytes}, Host: {hostSlots, slotBytes}, NVMe: {nvmeSlots, blockBytes}}
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
	if err := c.SetUsableSlots(Host, c.readyHostSlots()); err != nil {
		return fail(err)
	}
	c.growing.Add(1)
	go c.growHost(start)
	log.Info("kvtier: open", "gpu_slots", o.GPU.NumBlocks, "host_slots", hostSlots, "nvme_slots", nvmeSlots,
		"block_bytes", blockBytes, "write_through", o.WriteThrough)
	return c, nil
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
	if c.Mover != nil {
		errs = append(errs, c.Mover.Close())
	}
	for _, e := range []*transfer.Engine{c.Engine, c.Bounce} {
		if e != nil {
			errs = append(errs, e.Close())
		}
	}
	if c.Store != nil {
		errs = append(errs, c.Store.Close())
	}
	if c.pool != nil {
		errs = append(errs, c.pool.Close())
	}
	return errors.Join(errs...)
}
