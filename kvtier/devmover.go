package kvtier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/transfer"
)

// DeviceMover is the Mover that moves blocks with the real components:
// kvtier/transfer for GPU and host memory, kvtier/nvme for the NVMe tier.
//
// Slots map one to one: the manager's GPU slot s is the engine's GPU block s,
// its host slot s is the engine's host slot s (DeviceMoverConfig.Host), and
// its NVMe slot s is store slot nvmeSlot[s], one of the store slots the mover
// allocated at NewDeviceMover.
//
// The paths:
//
//   - GPU to host and host to GPU: the ops of one Submit go out as one
//     Engine.Offload and one Engine.Onboard.
//   - Host to NVMe: one Store.WriteBatch of the host slots' first BlockBytes,
//     with a header naming the block (key, parent, salt, and the token ids
//     when StoreTokens is set).
//   - NVMe to host: one Store.ReadBatch into the host slots; the header read
//     back must name the same block (key, salt, parent, tokens), or the op
//     fails. The store drops a corrupt slot itself.
//   - NVMe to GPU: Engine.OnboardStaged, reading each block from the store
//     into the engine's pinned staging ring (the engine's Config.Staging),
//     which copies buffer k while the store fills buffer k+1. The host tier
//     is not touched: it holds only blocks the manager put there.
//   - GPU to NVMe: Engine.Offload of a second engine (DeviceMoverConfig.Bounce)
//     into its pinned bounce slots, then Store.WriteBatch from them; a bounce
//     slot is reused only after that write returned.
//
// Every op completes only after the copy or I/O that reads or writes its
// slots has completed (the engine's Transfer is Done, or the store call has
// returned), so the manager never reuses a slot under a copy (invariants 2
// and 3). A failed copy, I/O or verification completes its ops with an
// error; the manager then forgets the destination, and also the NVMe copy
// when the error wraps ErrSourceLost (the store dropped a corrupt or
// unreadable slot, or it holds another block). A staged onboard or an engine
// transfer fails as a whole, so a failure fails every op in it.
//
// With a polled engine (transfer.Config.Polled, as the replay runs it on the
// simulated device's virtual clock) the GPU-host ops complete inside the
// engine's Poll, on its caller's goroutine; the NVMe paths still run on
// goroutines of the mover's, and GPU-to-NVMe copies need an engine that is
// not polled for their bounce (bounceCopy waits for its transfer).
//
// NVMe writes are as durable as the store makes them: with nvme.Config.Durable
// an op completes only once its block is synced.
//
// Checksums on the GPU. When the engine sums its transfers
// (transfer.Config.Sums) and the store is not keyed, the host never reads
// a payload to checksum it:
//
//   - an offload's sums (computed on the GPU) stay with its host slots, for
//     the blocks it moved, and a write of such a slot's block to NVMe hands
//     the store its sum (nvme.WriteOp.WordSummed); the bounce path does the
//     same when the bounce engine sums. A slot the host wrote itself (an
//     Insert into the host tier) has no sum, and the store hashes it;
//   - a load from NVMe to the GPU leaves the payload's check to the GPU
//     (nvme.ReadOp.DeferWordSum): the staged onboard sums the blocks as
//     they landed, and a block whose sum is not the one its header stores
//     fails its op with ErrSourceLost, after the store was told
//     (Store.ReportCorrupt: the slot is dropped and cleared on disk). Its
//     layers may have been read by then: the caller MUST treat the op's
//     error as the block's loss, as for any failed load (recompute it);
//   - a read from NVMe into the host tier is checked in full by the store
//     (the host tier only ever holds checked blocks, since the remote tier
//     publishes from it), and a word-summed block keeps its sum there.
type DeviceMover struct {
	eng        *transfer.Engine
	host       transfer.HostLayout
	blockBytes int64
	store      *nvme.Store
	tokens     bool

	bounce      *transfer.Engine
	bounceHost  transfer.HostLayout
	bounceSlots chan int32 // free bounce slots

	// nvmeSlot maps the manager's NVMe slot to the store's; owner maps a
	// store slot back (-1 for spares), both fixed after NewDeviceMover.
	nvmeSlot []nvme.Slot
	owner    []int32
	// recovered is what NewDeviceMover kept from the store (KeepBlocks).
	recovered []Resident

	// mu guards writing: slots (the manager's) with a store write in
	// flight, so that a stale copy of a key is reclaimed only from a slot
	// nobody writes. cond is signalled when a slot's write ends.
	mu      sync.Mutex
	cond    sync.Cond
	writing []bool

	// sums: NVMe payloads are checksummed on the GPU (see the type's doc);
	// bounceSums: the bounce engine sums too. hostSums[s] is host slot s's
	// word sum, for the block it names, guarded by sumMu.
	sums, bounceSums bool
	sumMu            sync.Mutex
	hostSums         []hostSum

	wg    sync.WaitGroup
	stats moverCounters

	// testEarly completes engine ops as soon as they are submitted, before
	// their copies are done: the bug invariant 3 forbids. Tests set it to
	// prove that they would catch a slot reused too early.
	testEarly bool
}

// DeviceMoverConfig configures NewDeviceMover.
type DeviceMoverConfig struct {
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
	// takes every slot of it at NewDeviceMover: NVMeSlots of them back the
	// manager's NVMe tier, the rest are spares. The blocks left from a
	// previous run are freed, unless KeepBlocks is set.
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
	// a few pinned bounce slots. Nil fails such ops with ErrMovePath.
	Bounce     *transfer.Engine
	BounceHost transfer.HostLayout
}

// ErrMovePath marks an op whose tiers the DeviceMover was not configured to
// connect (for example GPU to NVMe without a bounce engine).
var ErrMovePath = errors.New("kvtier: no path between the tiers")

// ErrNVMeMismatch marks an NVMe read whose header names another block than
// the op's: the slot is not served.
var ErrNVMeMismatch = errors.New("kvtier: nvme slot holds another block")

// MoverStats counts the DeviceMover's ops by path, and its failures.
type MoverStats struct {
	Onboards, Offloads, NVMeWrites, NVMeReads, StagedLoads, BounceWrites uint64
	Failures                                                             uint64
	// Reclaims counts NVMe writes that first emptied a stale copy of their
	// block, left in a slot the manager had evicted it from.
	Reclaims uint64
}

type moverCounters struct {
	onboards, offloads, nvmeWrites, nvmeReads, staged, bounce, failures, reclaims atomic.Uint64
	lastErr                                                                       atomic.Pointer[error]
}

// failed counts n failed ops and keeps err as the last failure.
func (c *moverCounters) failed(n int, err error) {
	c.failures.Add(uint64(n))
	c.lastErr.Store(&err)
}

// NewDeviceMover checks cfg, takes the store's slots and returns the mover.
func NewDeviceMover(cfg DeviceMoverConfig) (*DeviceMover, error) {
	bad := func(field, format string, args ...any) (*DeviceMover, error) {
		return nil, configErr("DeviceMoverConfig."+field, format, args...)
	}
	switch {
	case cfg.Engine == nil:
		return bad("Engine", "is nil")
	case cfg.Host.Slots() == 0:
		return bad("Host", "holds no slot (%d bytes of %d-byte slots)", len(cfg.Host.Pool), cfg.Host.SlotBytes)
	case cfg.BlockBytes <= 0 || cfg.BlockBytes > cfg.Host.SlotBytes:
		return bad("BlockBytes", "%d is not in [1, Host.SlotBytes = %d]", cfg.BlockBytes, cfg.Host.SlotBytes)
	case cfg.Store == nil && cfg.NVMeSlots != 0:
		return bad("NVMeSlots", "is %d but Store is nil", cfg.NVMeSlots)
	case cfg.NVMeSlots < 0:
		return bad("NVMeSlots", "%d is negative", cfg.NVMeSlots)
	case cfg.Bounce != nil && cfg.BounceHost.Slots() == 0:
		return bad("BounceHost", "holds no slot but Bounce is set")
	case cfg.Bounce != nil && cfg.BounceHost.SlotBytes < cfg.BlockBytes:
		return bad("BounceHost.SlotBytes", "%d cannot hold a block of %d bytes", cfg.BounceHost.SlotBytes, cfg.BlockBytes)
	}
	d := &DeviceMover{
		eng: cfg.Engine, host: cfg.Host, blockBytes: cfg.BlockBytes,
		store: cfg.Store, tokens: cfg.StoreTokens,
		bounce: cfg.Bounce, bounceHost: cfg.BounceHost,
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

// takeStore maps the store's slots to the manager's and allocates all of
// them, so that a slot freed later is the only free one and Allocate
// returns it. The blocks left from before take the manager's first slots
// when keep is set, and are freed otherwise.
func (d *DeviceMover) takeStore(want int, keep bool) error {
	total := d.store.Info().Slots
	if total < want {
		return configErr("DeviceMoverConfig.NVMeSlots", "%d, but the store has only %d slots", want, total)
	}
	d.owner = make([]int32, total)
	for i := range d.owner {
		d.owner[i] = -1
	}
	d.nvmeSlot = make([]nvme.Slot, want)
	d.writing = make([]bool, want)
	var ferr error
	d.store.Range(func(s nvme.Slot, meta nvme.BlockMeta) bool {
		if i := len(d.recovered); keep && i < want && int64(meta.PayloadBytes) == d.blockBytes {
			d.nvmeSlot[i] = s
			d.owner[s] = int32(i)
			r := Resident{Slot: Slot(i), Key: Key(meta.Key), Parent: Key(meta.Parent), Salt: Salt(meta.Salt), Position: int(meta.Position)}
			if len(meta.Tokens) > 0 {
				r.Tokens = make([]int32, len(meta.Tokens))
				for j, tok := range meta.Tokens {
					r.Tokens[j] = int32(tok)
				}
			}
			d.recovered = append(d.recovered, r)
			return true
		}
		ferr = d.store.Free(s)
		return ferr == nil
	})
	if ferr != nil {
		return fmt.Errorf("kvtier: DeviceMover: free the store's leftover blocks: %w", ferr)
	}
	for i := len(d.recovered); ; i++ {
		s, err := d.store.Allocate()
		if errors.Is(err, nvme.ErrFull) {
			if i < want {
				return fmt.Errorf("kvtier: DeviceMover: the store gave %d free slots, %d wanted: %w", i, want, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("kvtier: DeviceMover: allocate store slot %d: %w", i, err)
		}
		if i < want {
			d.nvmeSlot[i] = s
			d.owner[s] = int32(i)
		}
	}
}

// Recovered returns the blocks NewDeviceMover kept from the store
// (DeviceMoverConfig.KeepBlocks) as residents of the manager's NVMe tier:
// pass them to Manager.Adopt(NVMe, ...) before the manager's first use.
// A block the manager does not adopt stays on the drive until its slot is
// written again.
func (d *DeviceMover) Recovered() []Resident { return d.recovered }

// Stats returns the mover's counters.
func (d *DeviceMover) Stats() MoverStats {
	c := &d.stats
	return MoverStats{
		Onboards: c.onboards.Load(), Offloads: c.offloads.Load(),
		NVMeWrites: c.nvmeWrites.Load(), NVMeReads: c.nvmeReads.Load(),
		StagedLoads: c.staged.Load(), BounceWrites: c.bounce.Load(),
		Failures: c.failures.Load(), Reclaims: c.reclaims.Load(),
	}
}

// LastError is the error of the last op that failed, nil if none has: the
// manager keeps a failed copy's error only for a lease that waits on it, so
// this is where a write-through's reason can be read.
func (d *DeviceMover) LastError() error {
	if p := d.stats.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Wait blocks until every op submitted so far has completed, with the
// copies their completions started (write-through, demotions). It MUST NOT
// run concurrently with manager calls that submit copies.
func (d *DeviceMover) Wait() { d.wg.Wait() }

// Close waits for the ops in flight (as Wait). It closes neither the
// engines nor the store: their owner does, after Close.
func (d *DeviceMover) Close() error {
	d.wg.Wait()
	return nil
}

// moveJob is the ops of one Submit, sorted by path. The ops are copied out
// of the Batch, which the manager recycles after its last Complete.
type moveJob struct {
	t                *Batch
	afters           []cudastream.Event // the producer events of its ops out of the GPU
	onboard, offload []transfer.Pair
	onIdx, offIdx    []int
	writes           []nvme.WriteOp
	writeIdx         []int
	reads            []nvme.ReadOp
	readIdx          []int
	want             []wantMeta // per read
	staged           []int32
	stagedIdx        []int
	stagedOps        []MoveOp
	stagedWant       []wantMeta
	bounceIdx        []int
	bounceGPU        []int32
	bounceMeta       []nvme.BlockMeta
	bounceTo         []Slot
	writeTo          []Slot    // manager NVMe slot of each write
	readTo           []Slot    // host slot of each read
	readKeys         []blockID // with sums: the block of each read
	offKeys          []blockID // with sums: the block of each offload
}

// addAfter adds a producer event to the job's (once each), and reports
// false for one that is not a device event.
func (j *moveJob) addAfter(e Event) bool {
	ev, ok := e.(cudastream.Event)
	if !ok {
		return false
	}
	for _, have := range j.afters {
		if have == ev {
			return true
		}
	}
	j.afters = append(j.afters, ev)
	return true
}

// wantMeta is the identity an NVMe read must find.
type wantMeta struct {
	key, parent, salt uint64
	position          uint32
	tokens            []uint32
}

// Submit implements Mover. It never returns an error: an op it cannot start
// is completed with the error at once.
func (d *DeviceMover) Submit(t *Batch) error {
	j := &moveJob{t: t}
	var fail []int
	var failErr []error
	for i, op := range t.Ops {
		if op.After != nil && !j.addAfter(op.After) {
			fail, failErr = append(fail, i), append(failErr, fmt.Errorf("%w: MoveOp.After is a %T, not a cudastream.Event", ErrBadInput, op.After))
			continue
		}
		switch {
		case (op.From == Host && int(op.FromSlot) >= d.host.Slots()) || (op.To == Host && int(op.ToSlot) >= d.host.Slots()):
			fail, failErr = append(fail, i), append(failErr, fmt.Errorf("%w: host slot out of the pool's %d (DeviceMoverConfig.Host)", ErrBadInput, d.host.Slots()))
		case op.From == GPU && op.To == Host:
			d.forgetHostSum(op.ToSlot)
			j.offload = append(j.offload, transfer.Pair{GPUBlock: int32(op.FromSlot), HostSlot: int32(op.ToSlot)})
			j.offIdx = append(j.offIdx, i)
			if d.sums {
				j.offKeys = append(j.offKeys, blockID{op.Key, op.Salt})
			}
		case op.From == Host && op.To == GPU:
			j.onboard = append(j.onboard, transfer.Pair{GPUBlock: int32(op.ToSlot), HostSlot: int32(op.FromSlot)})
			j.onIdx = append(j.onIdx, i)
		case d.store == nil && (op.From == NVMe || op.To == NVMe):
			fail, failErr = append(fail, i), append(failErr, fmt.Errorf("%w: %v to %v: the mover has no NVMe store", ErrMovePath, op.From, op.To))
		case int(op.FromSlot) >= len(d.nvmeSlot) && op.From == NVMe, int(op.ToSlot) >= len(d.nvmeSlot) && op.To == NVMe:
			fail, failErr = append(fail, i), append(failErr, fmt.Errorf("%w: nvme slot out of the mover's %d (DeviceMoverConfig.NVMeSlots)", ErrBadInput, len(d.nvmeSlot)))
		case op.From == Host && op.To == NVMe:
			meta := blockMeta(&t.Ops[i], d.tokens)
			w := nvme.WriteOp{Slot: d.nvmeSlot[op.ToSlot], Meta: meta, Payload: d.host.Slot(int32(op.FromSlot))[:d.blockBytes]}
			w.WordSum, w.WordSummed = d.hostSumOf(op.FromSlot, &t.Ops[i])
			j.writes = append(j.writes, w)
			j.writeIdx = append(j.writeIdx, i)
			j.writeTo = append(j.writeTo, op.ToSlot)
		case op.From == NVMe && op.To == Host:
			d.forgetHostSum(op.ToSlot)
			meta := blockMeta(&t.Ops[i], d.tokens)
			j.reads = append(j.reads, nvme.ReadOp{Slot: d.nvmeSlot[op.FromSlot], Dst: d.host.Slot(int32(op.ToSlot)), Meta: nvme.BlockMeta{Tokens: make([]uint32, 0, len(meta.Tokens))}})
			j.readIdx = append(j.readIdx, i)
			j.readTo = append(j.readTo, op.ToSlot)
			j.readKeys = append(j.readKeys, blockID{op.Key, op.Salt})
			j.want = append(j.want, wantMeta{meta.Key, meta.Parent, meta.Salt, meta.Position, meta.Tokens})
		case op.From == NVMe && op.To == GPU:
			meta := blockMeta(&t.Ops[i], d.tokens)
			j.staged = append(j.staged, int32(op.ToSlot))
			j.stagedIdx = append(j.stagedIdx, i)
			j.stagedOps = append(j.stagedOps, op)
			j.stagedWant = append(j.stagedWant, wantMeta{meta.Key, meta.Parent, meta.Salt, meta.Position, meta.Tokens})
		case op.From == GPU && op.To == NVMe && d.bounce != nil:
			j.bounceIdx = append(j.bounceIdx, i)
			j.bounceGPU = append(j.bounceGPU, int32(op.FromSlot))
			j.bounceMeta = append(j.bounceMeta, blockMeta(&t.Ops[i], d.tokens))
			j.bounceTo = append(j.bounceTo, op.ToSlot)
		default:
			fail, failErr = append(fail, i), append(failErr, fmt.Errorf("%w: %v to %v (GPU to NVMe needs DeviceMoverConfig.Bounce)", ErrMovePath, op.From, op.To))
		}
	}
	// Start everything before completing anything: a Complete may be the
	// transfer's last and recycle t. An engine call that fails fails its
	// ops with the others that could not start, at the end.
	started := func(idx []int, tr *transfer.Transfer, err error, what string, src *storeSource, each func(int, *transfer.Transfer) error) {
		if err == nil {
			d.finishEngine(t, idx, tr, what, src, each)
			return
		}
		err = fmt.Errorf("%s of %d blocks: %w", what, len(idx), err)
		for _, i := range idx {
			fail, failErr = append(fail, i), append(failErr, err)
		}
	}
	if len(j.offload) > 0 {
		d.stats.offloads.Add(uint64(len(j.offload)))
		tr, err := d.eng.Offload(context.Background(), j.offload, j.afters...)
		started(j.offIdx, tr, err, "offload", nil, d.keepHostSums(j.offload, j.offKeys))
	}
	if len(j.onboard) > 0 {
		d.stats.onboards.Add(uint64(len(j.onboard)))
		tr, err := d.eng.Onboard(context.Background(), j.onboard)
		started(j.onIdx, tr, err, "onboard", nil, nil)
	}
	if len(j.staged) > 0 {
		d.stats.staged.Add(uint64(len(j.staged)))
		src := &storeSource{d: d, ops: j.stagedOps, want: j.stagedWant, lost: -1}
		if d.sums {
			src.checks = make([]nvme.PayloadCheck, len(j.staged))
		}
		tr, err := d.eng.OnboardStaged(context.Background(), src, j.staged)
		started(j.stagedIdx, tr, err, "staged onboard from nvme", src, src.checkSum)
	}
	if len(j.writes) > 0 {
		d.stats.nvmeWrites.Add(uint64(len(j.writes)))
		d.wg.Add(1)
		go d.runWrites(j)
	}
	if len(j.reads) > 0 {
		d.stats.nvmeReads.Add(uint64(len(j.reads)))
		d.wg.Add(1)
		go d.runReads(j)
	}
	if len(j.bounceIdx) > 0 {
		d.stats.bounce.Add(uint64(len(j.bounceIdx)))
		d.wg.Add(1)
		go d.runBounce(j)
	}
	for k, i := range fail {
		d.stats.failed(1, failErr[k])
		t.Complete(i, failErr[k])
	}
	return nil
}

// finishEngine completes ops idx of t when the engine's transfer is done,
// never before (Transfer.OnDone: on a goroutine of the engine's, or inside
// a polled engine's Poll). src, for a staged onboard, names the op whose
// NVMe block was lost. each, if set, runs for op k of a transfer done
// without error, before the transfer is released, and returns that op's
// error.
func (d *DeviceMover) finishEngine(t *Batch, idx []int, tr *transfer.Transfer, what string, src *storeSource, each func(k int, tr *transfer.Transfer) error) {
	ly := &engineLayers{tr: tr}
	ly.refs.Store(1)
	if tr.Layers() > 0 {
		ly.refs.Add(1)
		t.AddLayers(ly)
	}
	if d.testEarly {
		for _, i := range idx {
			t.Complete(i, nil)
		}
		d.wg.Add(1)
		tr.OnDone(func() {
			defer d.wg.Done()
			ly.Release()
		})
		return
	}
	d.wg.Add(1)
	tr.OnDone(func() {
		defer d.wg.Done()
		err := tr.Err()
		var errs []error
		if err == nil && each != nil {
			errs = make([]error, len(idx))
			for k := range idx {
				if errs[k] = each(k, tr); errs[k] != nil {
					errs[k] = fmt.Errorf("%s of %d blocks: block %d: %w", what, len(idx), k, errs[k])
					d.stats.failed(1, errs[k])
				}
			}
		}
		ly.Release()
		if err != nil {
			err = fmt.Errorf("%s of %d blocks: %w", what, len(idx), err)
			d.stats.failed(len(idx), err)
		}
		for k, i := range idx {
			e := err
			if e != nil && src != nil && k == src.lost {
				e = fmt.Errorf("%w: %w", ErrSourceLost, e)
			}
			if errs != nil {
				e = errs[k]
			}
			t.Complete(i, e)
		}
	})
}

// engineLayers hands an engine transfer's layer events to the manager
// (Batch.AddLayers). The transfer's events return to the engine once both
// the transfer is done and the manager has released them: refs counts the
// two.
type engineLayers struct {
	tr   *transfer.Transfer
	refs atomic.Int32
}

func (e *engineLayers) NumLayers() int { return e.tr.Layers() }

// LayerEvent implements Layers. For a load staged from NVMe, or one
// through the gather path, the transfer's LayerEvent first waits until the
// engine has recorded the events: an event not yet recorded would count as
// complete.
func (e *engineLayers) LayerEvent(l int) Event { return e.tr.LayerEvent(l) }

func (e *engineLayers) WaitLayer(ctx context.Context, l int) error { return e.tr.WaitLayer(ctx, l) }

// Release implements Layers (and the mover's own release once the
// transfer is done).
func (e *engineLayers) Release() {
	if e.refs.Add(-1) == 0 {
		e.tr.Release()
	}
}

// lostBlock reports whether a failed NVMe read means the slot's block is
// gone (the store dropped it, or it names another block).
func lostBlock(err error) bool {
	return errors.Is(err, nvme.ErrNotFound) || errors.Is(err, ErrNVMeMismatch)
}

// runWrites writes host slots to the store, then completes the ops.
func (d *DeviceMover) runWrites(j *moveJob) {
	defer d.wg.Done()
	d.writeAll(j.writes, j.writeTo)
	for k, i := range j.writeIdx {
		err := j.writes[k].Err
		if err != nil {
			err = fmt.Errorf("nvme write of store slot %d: %w", j.writes[k].Slot, err)
			d.stats.failed(1, err)
		}
		j.t.Complete(i, err)
	}
}

// writeAll writes ops (to the manager's NVMe slots to), marking the slots
// busy meanwhile, then rewrites each op the store refused because a stale
// copy of its key sits in a slot the manager has since freed.
func (d *DeviceMover) writeAll(ops []nvme.WriteOp, to []Slot) {
	d.mu.Lock()
	for _, s := range to {
		d.writing[s] = true
	}
	d.mu.Unlock()
	err := d.store.WriteBatch(context.Background(), ops)
	d.mu.Lock()
	for _, s := range to {
		d.writing[s] = false
	}
	d.cond.Broadcast()
	d.mu.Unlock()
	if err != nil {
		for k := range ops {
			ops[k].Err = err
		}
		return
	}
	for k := range ops {
		if errors.Is(ops[k].Err, nvme.ErrKeyExists) {
			ops[k].Err = d.rewrite(&ops[k], to[k])
		}
	}
}

// rewrite empties the store slot that still holds op's key from before the
// manager evicted it there, then writes op again. The manager holds a block
// in one NVMe slot at a time and writes it only where it has none, so a
// copy elsewhere is stale, and its slot is free in the manager or reserved
// for another block's write. If that write is in flight, rewrite waits for
// it (it replaces the stale copy); otherwise it frees the slot and
// allocates it again, which returns the same slot since the mover holds
// all others. It holds no slot marked while it waits, so writers cannot
// wait for each other in a cycle.
func (d *DeviceMover) rewrite(op *nvme.WriteOp, slot Slot) error {
	d.mu.Lock()
	for {
		s, ok := d.store.Lookup(op.Meta.Key)
		if !ok || s == op.Slot {
			break
		}
		if o := d.owner[s]; o >= 0 && d.writing[o] {
			d.cond.Wait()
			continue
		}
		if err := d.store.Free(s); err != nil {
			d.mu.Unlock()
			return fmt.Errorf("%w (and freeing its stale copy failed: %w)", nvme.ErrKeyExists, err)
		}
		s2, err := d.store.Allocate()
		if err != nil {
			d.mu.Unlock()
			return fmt.Errorf("%w (and taking back store slot %d failed: %w)", nvme.ErrKeyExists, s, err)
		}
		if s2 != s {
			panic(fmt.Sprintf("kvtier: DeviceMover: freed store slot %d but Allocate returned %d: someone else allocates from the store", s, s2))
		}
		d.stats.reclaims.Add(1)
		break
	}
	d.writing[slot] = true
	d.mu.Unlock()
	err := d.store.Write(context.Background(), op.Slot, op.Meta, op.Payload)
	d.mu.Lock()
	d.writing[slot] = false
	d.cond.Broadcast()
	d.mu.Unlock()
	return err
}

// runReads reads store slots into host slots, checks what they hold, then
// completes the ops.
func (d *DeviceMover) runReads(j *moveJob) {
	defer d.wg.Done()
	err := d.store.ReadBatch(context.Background(), j.reads)
	for k, i := range j.readIdx {
		r := &j.reads[k]
		e := err
		if e == nil {
			e = r.Err
		}
		if e == nil {
			e = j.want[k].check(r.Meta)
		}
		if e == nil && d.sums && r.Check.Valid() {
			d.setHostSum(int32(j.readTo[k]), j.readKeys[k], r.Check.WordSum)
		}
		if e != nil {
			e = fmt.Errorf("nvme read of store slot %d: %w", r.Slot, e)
			d.stats.failed(1, e)
			if err == nil && lostBlock(e) {
				e = fmt.Errorf("%w: %w", ErrSourceLost, e)
			}
		}
		j.t.Complete(i, e)
	}
}

func (w *wantMeta) check(got nvme.BlockMeta) error {
	if got.Key != w.key || got.Parent != w.parent || got.Salt != w.salt || got.Position != w.position {
		return fmt.Errorf("%w: want key %#x parent %#x salt %#x position %d, found key %#x parent %#x salt %#x position %d",
			ErrNVMeMismatch, w.key, w.parent, w.salt, w.position, got.Key, got.Parent, got.Salt, got.Position)
	}
	if w.tokens != nil {
		if len(got.Tokens) != len(w.tokens) {
			return fmt.Errorf("%w: key %#x: %d tokens stored, want %d", ErrNVMeMismatch, w.key, len(got.Tokens), len(w.tokens))
		}
		for i := range got.Tokens {
			if got.Tokens[i] != w.tokens[i] {
				return fmt.Errorf("%w: key %#x: token %d differs", ErrNVMeMismatch, w.key, i)
			}
		}
	}
	return nil
}

// storeSource feeds a staged onboard from the store, checking each block.
type storeSource struct {
	d    *DeviceMover
	ops  []MoveOp
	want []wantMeta
	rd   [1]nvme.ReadOp
	lost int // the block whose slot was found lost, or -1; read after Done
	// With the mover's sums: the check of each block whose payload the
	// store left to the GPU (not Valid for the others); read after Done.
	checks []nvme.PayloadCheck
}

// ReadBlock implements transfer.Source. The engine calls it from one
// goroutine at a time.
func (s *storeSource) ReadBlock(ctx context.Context, i int, dst []byte) error {
	slot := s.d.nvmeSlot[s.ops[i].FromSlot]
	s.rd[0] = nvme.ReadOp{Slot: slot, Dst: dst, Meta: nvme.BlockMeta{Tokens: s.rd[0].Meta.Tokens[:0]}, DeferWordSum: s.d.sums}
	if err := s.d.store.ReadBatch(ctx, s.rd[:]); err != nil {
		return err
	}
	err := s.rd[0].Err
	if err == nil && s.checks != nil && s.rd[0].Deferred {
		s.checks[i] = s.rd[0].Check
	}
	if err == nil {
		err = s.want[i].check(s.rd[0].Meta)
	}
	if err != nil {
		if lostBlock(err) {
			s.lost = i
		}
		return fmt.Errorf("store slot %d: %w", slot, err)
	}
	return nil
}

// checkSum is the staged onboard's per-block check (finishEngine's each):
// a block whose check the store left to the GPU must have landed with the
// sum its header stores; one that did not is reported to the store, which
// drops its slot, and fails with ErrSourceLost.
func (s *storeSource) checkSum(k int, tr *transfer.Transfer) error {
	if s.checks == nil || !s.checks[k].Valid() {
		return nil
	}
	sums := tr.Sums()
	if k >= len(sums) {
		return fmt.Errorf("kvtier: DeviceMover: the staged onboard returned %d sums for %d blocks", len(sums), len(s.checks))
	}
	c := s.checks[k]
	if sums[k] == c.WordSum {
		return nil
	}
	err := fmt.Errorf("%w: %w: nvme block %#x landed with word sum %#x, its header says %#x", ErrSourceLost, nvme.ErrCorrupt, s.ops[k].Key, sums[k], c.WordSum)
	if rerr := s.d.store.ReportCorrupt(c); rerr != nil {
		err = fmt.Errorf("%w (and reporting it to the store failed: %w)", err, rerr)
	}
	return err
}

// hostSum is a host slot's word sum and the block it is of. The manager
// may hand a slot to writers the mover does not see (an Insert into the
// host tier, RemoteTier.Fetch), so a sum counts only for the block an op
// names: a slot rewritten with another block is hashed by the store. The
// same block written into the slot by someone else is assumed to hold the
// same bytes; if it does not, its NVMe copy fails its check on the GPU at
// its first load and is recomputed, never served.
type hostSum struct {
	block blockID
	sum   uint64
	ok    bool
}

// blockID names a block for its host sum.
type blockID struct {
	key  Key
	salt Salt
}

// forgetHostSum drops host slot s's sum: new bytes are coming.
func (d *DeviceMover) forgetHostSum(s Slot) {
	if !d.sums {
		return
	}
	d.sumMu.Lock()
	d.hostSums[s] = hostSum{}
	d.sumMu.Unlock()
}

// hostSumOf returns host slot s's word sum, if it has one for op's block.
func (d *DeviceMover) hostSumOf(s Slot, op *MoveOp) (uint64, bool) {
	if !d.sums {
		return 0, false
	}
	d.sumMu.Lock()
	defer d.sumMu.Unlock()
	h := d.hostSums[s]
	return h.sum, h.ok && h.block == blockID{op.Key, op.Salt}
}

// setHostSum records host slot s's word sum for block b.
func (d *DeviceMover) setHostSum(s int32, b blockID, sum uint64) {
	d.sumMu.Lock()
	d.hostSums[s] = hostSum{block: b, sum: sum, ok: true}
	d.sumMu.Unlock()
}

// keepHostSums is an offload's per-block step (finishEngine's each): the
// sums of the GPU blocks it copied become their host slots', for blocks
// (one per pair). nil without sums.
func (d *DeviceMover) keepHostSums(pairs []transfer.Pair, blocks []blockID) func(int, *transfer.Transfer) error {
	if !d.sums {
		return nil
	}
	return func(k int, tr *transfer.Transfer) error {
		if sums := tr.Sums(); k < len(sums) {
			d.setHostSum(pairs[k].HostSlot, blocks[k], sums[k])
		}
		return nil
	}
}

// runBounce moves GPU blocks to the store through the bounce slots, a few
// at a time: it waits for one free slot, takes whatever others are free, and
// never holds slots while waiting for more (so jobs cannot deadlock).
func (d *DeviceMover) runBounce(j *moveJob) {
	defer d.wg.Done()
	n := len(j.bounceIdx)
	pairs := make([]transfer.Pair, 0, cap(d.bounceSlots))
	ops := make([]nvme.WriteOp, 0, cap(d.bounceSlots))
	for next := 0; next < n; {
		pairs = append(pairs[:0], transfer.Pair{GPUBlock: j.bounceGPU[next], HostSlot: <-d.bounceSlots})
	more:
		for len(pairs) < n-next {
			select {
			case s := <-d.bounceSlots:
				pairs = append(pairs, transfer.Pair{GPUBlock: j.bounceGPU[next+len(pairs)], HostSlot: s})
			default:
				break more
			}
		}
		k := len(pairs)
		sums, err := d.bounceCopy(pairs, j.afters)
		ops = ops[:0]
		for c := range k {
			w := nvme.WriteOp{Slot: d.nvmeSlot[j.bounceTo[next+c]], Meta: j.bounceMeta[next+c],
				Payload: d.bounceHost.Slot(pairs[c].HostSlot)[:d.blockBytes]}
			if c < len(sums) && d.bounceSums {
				w.WordSum, w.WordSummed = sums[c], true
			}
			ops = append(ops, w)
		}
		if err == nil {
			d.writeAll(ops, j.bounceTo[next:next+k])
		}
		for _, p := range pairs { // the writes have returned: reuse is safe
			d.bounceSlots <- p.HostSlot
		}
		for c := range k {
			e := err
			if e == nil {
				e = ops[c].Err
			}
			if e != nil {
				e = fmt.Errorf("gpu to nvme through bounce slot %d: %w", pairs[c].HostSlot, e)
				d.stats.failed(1, e)
			}
			j.t.Complete(j.bounceIdx[next+c], e)
		}
		next += k
	}
}

// bounceCopy offloads pairs into the bounce pool, on the device after
// after (nil: at once), and waits for the copy. It returns the blocks' word
// sums when the bounce engine sums (nil otherwise). It runs on the mover's
// goroutine, off the request's path.
func (d *DeviceMover) bounceCopy(pairs []transfer.Pair, after []cudastream.Event) ([]uint64, error) {
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

// blockMeta returns the identity of op i's block for an NVMe header: key,
// parent, salt, position, and its token ids when withTokens is set and the
// op carries them.
func blockMeta(op *MoveOp, withTokens bool) nvme.BlockMeta {
	meta := nvme.BlockMeta{Key: uint64(op.Key), Parent: uint64(op.Parent), Salt: uint64(op.Salt), Position: uint32(op.Position)}
	if withTokens && op.Tokens != nil {
		meta.Tokens = make([]uint32, len(op.Tokens))
		for k, v := range op.Tokens {
			meta.Tokens[k] = uint32(v)
		}
	}
	return meta
}
