package devmover

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/transfer"
)

// Mover moves the manager's blocks with the copy engine and the NVMe store
// (see the package doc). It is safe for concurrent use.
//
// With a polled engine (transfer.Config.Polled, as the replay runs it on the
// simulated device's virtual clock) the GPU-host ops complete inside the
// engine's Poll, on its caller's goroutine; the NVMe paths still run on
// goroutines of the mover's, and GPU-to-NVMe copies need a bounce engine
// that is not polled.
type Mover struct {
	eng        *transfer.Engine
	host       transfer.HostLayout
	blockBytes int64
	store      *nvme.Store
	tokens     bool
	nvmeCodec  codec.Codec // Config.Codec

	bounce      *transfer.Engine
	bounceHost  transfer.HostLayout
	bounceSlots chan int32 // free bounce slots

	// nvmeSlot maps the manager's NVMe slot to the store's; owner maps a
	// store slot back (-1 for spares), both fixed after New.
	nvmeSlot []nvme.Slot
	owner    []int32
	// recovered is what New kept from the store (Config.KeepBlocks).
	recovered []kvtier.Resident

	// mu guards writing: slots (the manager's) with a store write in
	// flight, so that a stale copy of a key is reclaimed only from a slot
	// nobody writes. cond is signalled when a slot's write ends.
	mu      sync.Mutex
	cond    sync.Cond
	writing []bool

	// sums: NVMe payloads are checksummed on the GPU (sums.go);
	// bounceSums: the bounce engine sums too. hostSums[s] is host slot s's
	// word sum, for the block it names, guarded by sumMu.
	sums, bounceSums bool
	sumMu            sync.Mutex
	hostSums         []hostSum

	// drive schedules and measures the store's I/O (drive.go).
	drive *drive

	wg    sync.WaitGroup
	stats counters

	// testEarly completes engine ops as soon as they are submitted, before
	// their copies are done: the bug invariant 3 forbids. Tests set it to
	// prove that they would catch a slot reused too early.
	testEarly bool
}

// Config configures New.
type Config struct {
	// Engine moves blocks between the GPU layout and the host pool. Its
	// Config.Staging ring is needed for NVMe-to-GPU loads. Required.
	Engine *transfer.Engine
	// Host is the engine's host pool (the same Config.Host): the manager's
	// host slot s is Host.Slot(s). The manager's host tier MUST have at
	// most Host.Slots() slots.
	Host transfer.HostLayout
	// BlockBytes is one block's KV size (the engine's GPULayout.BlockBytes()):
	// what the NVMe tier stores of each slot.
	BlockBytes int64
	// Store is the NVMe tier; nil when the manager has none. The mover
	// takes every slot of it at New: NVMeSlots of them back the manager's
	// NVMe tier, the rest are spares. The blocks left from a previous run
	// are freed, unless KeepBlocks is set.
	Store *nvme.Store
	// KeepBlocks keeps the blocks the store recovered at Open (a previous
	// run's) instead of freeing them: they take the manager's first NVMe
	// slots, and Recovered lists them for Manager.Adopt, so that a
	// restarted server keeps its warm NVMe tier. Blocks beyond NVMeSlots,
	// or whose payload is not BlockBytes long, are freed.
	KeepBlocks bool
	// NVMeSlots is the manager's NVMe slot count (its CapacityBytes /
	// SlotBytes); the store must have at least that many slots.
	NVMeSlots int
	// StoreTokens writes each block's token ids into its NVMe header and
	// checks them on every read. The store's MaxTokens MUST be at least the
	// manager's BlockTokens.
	StoreTokens bool
	// Bounce and BounceHost carry GPU-to-NVMe copies (an Offload to NVMe of
	// a block not in the host tier, or a demotion when the host tier is
	// absent): a second engine over the same GPU layout whose host pool is
	// a few pinned bounce slots. Nil fails such ops with ErrNoPath.
	Bounce     *transfer.Engine
	BounceHost transfer.HostLayout
	// Codec is how the NVMe tier holds blocks: the engines' Config.Codec
	// (their host slots and staging buffers hold the same bytes, which
	// the mover moves as they are). BlockBytes is then the encoded size.
	// The store's slot headers record it, and a read of a slot that
	// records another is not served.
	Codec codec.Codec
	// OnDriveIO, if set, is told of every NVMe read and write the mover
	// measured (a server's calibration learns the drive's links from it).
	// It is called on the mover's goroutines and MUST NOT block.
	OnDriveIO func(write bool, bytes int64, d time.Duration)
}

// ErrNoPath marks an op whose tiers the Mover was not configured to connect
// (for example GPU to NVMe without a bounce engine).
var ErrNoPath = errors.New("devmover: no path between the tiers")

// ErrNVMeMismatch marks an NVMe read whose header names another block than
// the op's: the slot is not served.
var ErrNVMeMismatch = errors.New("devmover: nvme slot holds another block")

// Stats counts the Mover's ops by path, and its failures.
type Stats struct {
	Onboards, Offloads, NVMeWrites, NVMeReads, StagedLoads, BounceWrites uint64
	Failures                                                             uint64
	// Dropped counts NVMe writes not made because their block was no
	// longer wanted when their turn came (kvtier.Batch.Wanted).
	Dropped uint64
	// Reclaims counts NVMe writes that first emptied a stale copy of their
	// block, left in a slot the manager had evicted it from.
	Reclaims uint64
}

type counters struct {
	onboards, offloads, nvmeWrites, nvmeReads, staged, bounce, failures, reclaims, dropped atomic.Uint64
	lastErr                                                                                atomic.Pointer[error]
}

// failed counts n failed ops and keeps err as the last failure.
func (c *counters) failed(n int, err error) {
	c.failures.Add(uint64(n))
	c.lastErr.Store(&err)
}

func configErr(field, format string, args ...any) error {
	return fmt.Errorf("%w: devmover.Config.%s: %s", kvtier.ErrConfig, field, fmt.Sprintf(format, args...))
}

// New checks cfg, takes the store's slots and returns the mover.
func New(cfg Config) (*Mover, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := &Mover{
		eng: cfg.Engine, host: cfg.Host, blockBytes: cfg.BlockBytes,
		store: cfg.Store, tokens: cfg.StoreTokens, nvmeCodec: cfg.Codec,
		bounce: cfg.Bounce, bounceHost: cfg.BounceHost,
		drive: newDrive(cfg.OnDriveIO),
	}
	d.cond.L = &d.mu
	if cfg.Store != nil && cfg.Engine.Sums() && !cfg.Store.Info().Keyed {
		d.sums = true
		d.bounceSums = cfg.Bounce != nil && cfg.Bounce.Sums()
		d.hostSums = make([]hostSum, cfg.Host.Slots())
	}
	if cfg.Bounce != nil {
		n := cfg.BounceHost.Slots()
		d.bounceSlots = make(chan int32, n)
		for i := range n {
			d.bounceSlots <- int32(i)
		}
	}
	if cfg.Store == nil {
		return d, nil
	}
	if err := d.takeStore(cfg.NVMeSlots, cfg.KeepBlocks); err != nil {
		return nil, err
	}
	return d, nil
}

func (cfg *Config) validate() error {
	switch {
	case cfg.Engine == nil:
		return configErr("Engine", "is nil")
	case cfg.Codec.Check() != nil:
		return configErr("Codec", "%v", cfg.Codec.Check())
	case cfg.Host.Slots() == 0:
		return configErr("Host", "holds no slot (%d bytes of %d-byte slots)", len(cfg.Host.Pool), cfg.Host.SlotBytes)
	case cfg.BlockBytes <= 0 || cfg.BlockBytes > cfg.Host.SlotBytes:
		return configErr("BlockBytes", "%d is not in [1, Host.SlotBytes = %d]", cfg.BlockBytes, cfg.Host.SlotBytes)
	case cfg.Store == nil && cfg.NVMeSlots != 0:
		return configErr("NVMeSlots", "is %d but Store is nil", cfg.NVMeSlots)
	case cfg.NVMeSlots < 0:
		return configErr("NVMeSlots", "%d is negative", cfg.NVMeSlots)
	case cfg.Bounce != nil && cfg.BounceHost.Slots() == 0:
		return configErr("BounceHost", "holds no slot but Bounce is set")
	case cfg.Bounce != nil && cfg.BounceHost.SlotBytes < cfg.BlockBytes:
		return configErr("BounceHost.SlotBytes", "%d cannot hold a block of %d bytes", cfg.BounceHost.SlotBytes, cfg.BlockBytes)
	}
	return nil
}

// Recovered returns the blocks New kept from the store (Config.KeepBlocks)
// as residents of the manager's NVMe tier: pass them to
// Manager.Adopt(NVMe, ...) before the manager's first use. A block the
// manager does not adopt stays on the drive until its slot is written again.
func (d *Mover) Recovered() []kvtier.Resident { return d.recovered }

// BlockBytes is one block's KV size: what the NVMe tier stores of a slot.
func (d *Mover) BlockBytes() int64 { return d.blockBytes }

// Stats returns the mover's counters.
func (d *Mover) Stats() Stats {
	c := &d.stats
	return Stats{
		Onboards: c.onboards.Load(), Offloads: c.offloads.Load(),
		NVMeWrites: c.nvmeWrites.Load(), NVMeReads: c.nvmeReads.Load(),
		StagedLoads: c.staged.Load(), BounceWrites: c.bounce.Load(),
		Failures: c.failures.Load(), Reclaims: c.reclaims.Load(), Dropped: c.dropped.Load(),
	}
}

// LastError is the error of the last op that failed, nil if none has: the
// manager keeps a failed copy's error only for a lease that waits on it, so
// this is where a write-through's reason can be read.
func (d *Mover) LastError() error {
	if p := d.stats.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Wait blocks until every op submitted so far has completed, with the
// copies their completions started (write-through, demotions). It MUST NOT
// run concurrently with manager calls that submit copies.
func (d *Mover) Wait() { d.wg.Wait() }

// Close waits for the ops in flight (as Wait). It closes neither the
// engines nor the store: their owner does, after Close.
func (d *Mover) Close() error {
	d.wg.Wait()
	return nil
}
