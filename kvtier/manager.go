// Package kvtier is the block manager: it knows which KV blocks exist, where
// each lives (GPU, host, NVMe), who is using it, and what to evict.
//
// It promises:
//
//   - Wrong KV is never served. A block is found by its chained key, but a hit
//     is confirmed against the stored salt, parent key, position and token ids,
//     so a hash collision is a miss (invariant 1). Callers that hash elsewhere
//     (traces) pass keys; their hits are confirmed by salt, parent key and
//     position only, which is as strong as their keys.
//   - A block is readable from a tier only once its copy into that tier has
//     completed (invariant 2), and a slot is reused only after every copy that
//     reads or writes it has completed (invariant 3).
//   - No tier holds more slots than its capacity, and a block held by a Lease
//     or a copy is never evicted (invariant 4).
//   - Lookups allocate nothing once the Lease has grown (invariant 5), and the
//     metadata of a resident block is plain values in flat arrays (a 64-byte
//     record, one cache line; a 12-byte index entry at most 3/4 full; a
//     free-list entry), which the garbage collector never scans.
//
// Concurrency (details in stripe.go): a striped readers-writer lock guards
// all metadata, and a mutex of their own guards the policies and admitters
// (which have no lock inside). Lookups, and Releases of leases that
// reserved no slot, read-lock one stripe: they hash outside it, probe the
// index and verify tokens in parallel with each other, and write no shared
// cache line: a lookup pins its Lease instead of counting references on
// each block, and the next write-locked operation turns the pins into
// references before anything can be evicted. Their policy touches and
// admission records are queued per stripe at Release (or applied at the
// lease's Onboard or Offload) and applied in batches, in order per stripe,
// by the next writer or by a releaser that finds its queue full, so recency
// counts from the end of a use. Recency from lookups is approximate in two
// bounded ways: when the queue is full and the policies are busy, touches
// are dropped (Metrics.DroppedTouches), and a block already touched within
// the last slots/256 policy operations of its tier is not touched again
// (it is among the most recent 1/256 of an LRU). Inserts touch exactly.
// Everything else takes the lock for writing (every stripe). The Mover and
// the Planner are called, and copy completions are processed, without it
// held, so a Mover may complete copies from inside Submit.
//
// A request's path:
//
//	m.Lookup(salt, tokens, &l)  // leased prefix, best tier of each block
//	m.Plan(&l)                  // load or recompute, per block
//	m.Onboard(&l)               // copies into GPU slots (Block.GPUSlot)
//	l.LayerEvents(i, evs)       // layer i landed: the compute stream waits
//	                            // on these (or l.WaitLayer, or m.Wait for all)
//	...                         // prefill the rest, into slots from:
//	m.Insert(salt, tokens, GPU, &w); enqueue the writes of Blocks with Write
//	m.CommitAfter(&w, ev)       // ev marks them written (Commit: done already)
//	m.Offload(&w, Host)         // waits for ev on the device; or WriteThrough
//	m.Release(&w); m.Release(&l)
//
// Nothing on that path waits on the host for a copy: the copies out of the
// GPU wait for the producer's event on the device, and the compute stream
// waits for each layer's load on the device.
//
// A restarted server keeps its NVMe tier: with DeviceMoverConfig.KeepBlocks
// the mover keeps the blocks the store recovered at Open, and
// m.Adopt(NVMe, mover.Recovered()) hands them to the manager before its
// first use (examples/server -nvme-dir shows it).
package kvtier

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"kvtier.dev/kvtier/policy"
)

// Manager is the block manager. All methods are safe for concurrent use.
type Manager struct {
	// stripes hold the lock, which guards everything below: lookups
	// read-lock one stripe (index, records and tokens are only read,
	// references are added atomically); everything else write-locks all
	// of them (m.lock). They also hold the lookups' counters and queued
	// policy touches.
	stripes []stripe

	// What follows up to the next padding is written while lookups run:
	// it keeps off the cache lines lookups read.
	_          [64]byte
	nextStripe atomic.Uint32
	// policyMu guards the tiers' policies and admitters, the records'
	// touch stamps, ticks and drainBuf. A writer takes it after the
	// stripes; drainTouches may hold it alone.
	policyMu     sync.Mutex
	touchPending atomic.Bool
	// ticks[t] counts tier t's policy inserts and touches (wrapping): the
	// clock of the records' touch stamps.
	ticks    [NumTiers]atomic.Uint32
	drainBuf [touchBufLen]touch // drainTouches' scratch
	_        [64]byte

	blockTokens  int
	maxHoles     int
	writeThrough bool
	mover        Mover
	planner      Planner
	recompute    func(position int) float64

	tiers [NumTiers]tierState
	slots [NumTiers]uint32
	recs  slab
	index table
	// gpuWritten[s] is the CommitAfter event of the block in GPU slot s
	// until the lease that committed it is released after the event
	// completed: every copy out of the slot waits for it (MoveOp.After).
	gpuWritten []Event
	metrics    *counters
	gauges     gauges
	// admitters is set when a tier has an Admitter; lookups then keep
	// their keys so that Release can record them.
	admitters bool

	// busy counts the batches not yet finished and the releases waiting
	// for a CommitAfter event; drained, when set, is closed when busy
	// reaches 0 (Drain waits on it).
	busy    int
	drained chan struct{}

	bg    *Batch   // copies decided under mu, submitted after unlock
	xpool []*Batch // idle transfers
	ops   uint64   // mutations, for sampled invariant checks

	// testKeyHook, when set, replaces every computed key (tests force
	// collisions with it).
	testKeyHook func(Key) Key
}

type tierState struct {
	present   bool
	slotBytes int64
	slots     uint32
	next      uint32 // slots below next have been handed out at least once
	usable    uint32 // slots at or above usable are not handed out yet (SetUsableSlots)
	free      []Slot
	policy    policy.Policy[BlockRef]
	window    uint32 // lookups skip touching blocks stamped within it
	admitter  policy.Admitter[Key]
	evictable func(BlockRef) bool
	below     Tier // next present tier, or NumTiers
}

// New validates cfg and returns a Manager. The Manager owns cfg's policies,
// admitters, Mover and Planner from now on.
func New(cfg Config) (*Manager, error) {
	slots, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	m := &Manager{
		blockTokens:  cfg.BlockTokens,
		maxHoles:     cfg.MaxHoleBlocks,
		writeThrough: cfg.WriteThrough,
		mover:        cfg.Mover,
		planner:      cfg.Planner,
		recompute:    cfg.RecomputeSeconds,
		slots:        slots,
		stripes:      make([]stripe, stripeCount()),
	}
	if m.planner == nil {
		m.planner = LoadAll{}
	}
	if !cfg.DisableMetrics {
		m.metrics = &m.stripes[0].c
	}
	if slots[GPU] > 0 {
		m.gpuWritten = make([]Event, slots[GPU])
	}
	m.recs.blockTokens = cfg.BlockTokens
	below := NumTiers
	for t := NumTiers - 1; t < NumTiers; t-- {
		tc := cfg.Tiers[t]
		ts := &m.tiers[t]
		ts.below = below
		if tc.CapacityBytes == 0 {
			continue
		}
		ts.present = true
		ts.slotBytes = tc.SlotBytes
		ts.slots = slots[t]
		ts.usable = slots[t]
		ts.window = slots[t] >> 8
		ts.policy = tc.Policy
		ts.admitter = tc.Admitter
		m.admitters = m.admitters || tc.Admitter != nil
		ts.evictable = func(v BlockRef) bool { return m.recs.at(v).evictableIn(t) }
		below = t
	}
	return m, nil
}

// BlockTokens is the number of tokens per block.
func (m *Manager) BlockTokens() int { return m.blockTokens }

// CapacitySlots is tier t's slot count (0 for an absent tier).
func (m *Manager) CapacitySlots(t Tier) int {
	if t >= NumTiers {
		return 0
	}
	return int(m.slots[t])
}

// Metrics returns a snapshot of the counters (zeros when disabled).
func (m *Manager) Metrics() Metrics {
	var inUse [NumTiers]int64
	m.lock() // exact in-use gauges: pinned leases become references
	resident, records := m.gauges.resident, m.recs.live()
	for i := range m.stripes {
		for t := range inUse {
			inUse[t] += m.stripes[i].inUse[t].Load()
		}
	}
	m.unlock()
	return m.snapshot(resident, inUse, records)
}

// Lookup finds the longest prefix of tokens' full blocks that is ready in
// some tier, verified token by token, and leases it: l.Blocks[i] is block i
// with its fastest ready tier and slot. None of them is evicted until the
// caller calls Release(l), which it MUST do; the use counts for the eviction
// policies from then (or from an earlier Onboard or Offload of l). l MUST NOT
// hold a lease.
func (m *Manager) Lookup(salt Salt, tokens []int32, l *Lease) error {
	if err := m.begin(l); err != nil {
		return err
	}
	l.keys, l.buf = appendKeys(l.keys[:0], l.buf, m.blockTokens, salt, 0, tokens)
	m.hook(l.keys)
	m.lookup(salt, l.keys, tokens, l)
	l.tokens = len(tokens)
	return nil
}

// LookupKeys is Lookup for callers that computed the block keys themselves
// (keys[i] is block i's key, chained so that equal keys mean equal prefixes).
// Hits are verified by salt, parent key and position, not by tokens. Plan
// takes every key for a full block, unless the lease is told otherwise
// (Lease.SetTokens).
func (m *Manager) LookupKeys(salt Salt, keys []Key, l *Lease) error {
	if err := m.begin(l); err != nil {
		return err
	}
	l.keys = append(l.keys[:0], keys...)
	m.lookup(salt, keys, nil, l)
	l.tokens = len(keys) * m.blockTokens
	return nil
}

// Plan asks the configured Planner what to do with each block of the
// looked-up request and stores its answer in l.Blocks[i].Action, and its
// estimate in l.Estimate(). The planner sees the whole request: the
// blocks missing from the cache, after or between the cached ones, are
// recomputed (they are not in l.Blocks), and so is a partial last block;
// and the backlog the Mover reports (Backlogger). If the planner fails,
// Plan keeps LoadAll's answer and returns the error.
func (m *Manager) Plan(l *Lease) error {
	bt := m.blockTokens
	n := (l.tokens + bt - 1) / bt
	if k := len(l.Blocks); k > 0 {
		n = max(n, l.Blocks[k-1].Position+1)
	}
	l.plan = slices.Grow(l.plan[:0], n)[:n]
	l.actions = slices.Grow(l.actions[:0], n)[:n]
	clear(l.plan)
	for _, b := range l.Blocks {
		l.plan[b.Position] = PlanBlock{Cached: true, Tier: b.Tier}
	}
	req := &l.req
	*req = PlanRequest{Blocks: l.plan}
	if r := l.tokens % bt; r != 0 && n == (l.tokens+bt-1)/bt {
		req.LastTokens = r
	}
	if b, ok := m.mover.(Backlogger); ok {
		req.Backlog = b.Backlog()
	}
	est, err := m.planner.Plan(req, l.actions)
	if err != nil {
		_, _ = LoadAll{}.Plan(req, l.actions)
		est, err = Estimate{}, fmt.Errorf("kvtier: planner: %w", err)
	}
	l.estimate = est
	for i := range l.Blocks {
		b := &l.Blocks[i]
		a := l.actions[b.Position]
		switch {
		case b.Tier == GPU && a == Load:
			a = Use // nothing to load
		case b.Tier != GPU && a == Use:
			a = Load // a planner cannot use what is not in the GPU
		case a > Recompute:
			a = Recompute
		}
		b.Action, b.Why = a, Planned
	}
	return err
}

// Onboard submits copies into the GPU tier for the leased blocks whose Action
// is Load, reserving GPU slots (evicting as needed). Each such block gets
// Loading and its GPUSlot; the copies are done when Wait returns nil, and
// layer by layer when the lease's LayerEvents complete. A block Onboard
// cannot load gets Action Recompute and Why (counted in
// Metrics.Recomputes): no GPU slot is free now (in write-back mode,
// demotions may be under way: Onboard never waits for them), the block is
// being written into or evicted from the GPU, or its source copy was lost.
func (m *Manager) Onboard(l *Lease) error {
	if !l.leased || l.m != m {
		return fmt.Errorf("%w: Onboard: lease holds no lookup of this manager", ErrBadInput)
	}
	if !m.tiers[GPU].present {
		return fmt.Errorf("%w: Onboard: the gpu tier is absent", ErrBadInput)
	}
	turn := func(b *Block, why Reason) {
		b.Action, b.Why = Recompute, why
		m.metrics.recompute(why)
	}
	want := 0
	for _, b := range l.Blocks {
		if b.Action == Load && b.Tier != GPU && !b.Loading {
			want++
		}
	}
	m.lock()
	m.settle(l)
	var t *Batch
	full := false
	for i := range l.Blocks {
		b := &l.Blocks[i]
		if b.Action != Load || b.Tier == GPU || b.Loading {
			continue
		}
		want--
		r := m.recs.at(b.Ref)
		if best := r.best(); best < b.Tier && best != GPU { // promoted since the lookup
			b.Tier, b.Slot = best, r.slot[best]
		}
		switch r.state[GPU] {
		case stateReady:
			b.Tier, b.Slot, b.Action = GPU, r.slot[GPU], Use
			continue
		case stateWriting, stateEvicting:
			turn(b, GPUBusy)
			continue
		}
		if r.state[b.Tier] != stateReady { // its copy there was lost (ErrSourceLost)
			turn(b, SourceLost)
			continue
		}
		var slot Slot
		ok := false
		if !full {
			slot, ok = m.alloc(GPU, want+1)
			full = !ok
		}
		if !ok {
			turn(b, NoGPUSlot)
			continue
		}
		if t == nil {
			t = m.newTransfer(l)
		}
		m.startCopy(t, b.Ref, b.Tier, GPU, slot)
		b.GPUSlot, b.Loading = slot, true
	}
	m.unlockAndSubmit(t)
	return nil
}

// Insert makes tokens' full blocks resident in tier and leases them. Blocks
// already ready there are touched; blocks missing get a reserved slot and
// Write set: the caller MUST write their KV into those slots and then call
// Commit. Insert stops at the first block it cannot hold: one whose key is
// taken by a different block (a collision) or for which no slot is free
// (then it returns an error wrapping ErrNoSpace). The lease holds the blocks
// before it either way; Commit and Release them as usual. l MUST NOT hold a
// lease.
func (m *Manager) Insert(salt Salt, tokens []int32, tier Tier, l *Lease) error {
	if err := m.checkTier("Insert", tier); err != nil {
		return err
	}
	if err := m.begin(l); err != nil {
		return err
	}
	l.keys, l.buf = appendKeys(l.keys[:0], l.buf, m.blockTokens, salt, 0, tokens)
	m.hook(l.keys)
	return m.insert(salt, l.keys, tokens, tier, l)
}

// InsertKeys is Insert for callers that computed the block keys themselves.
func (m *Manager) InsertKeys(salt Salt, keys []Key, tier Tier, l *Lease) error {
	if err := m.checkTier("InsertKeys", tier); err != nil {
		return err
	}
	if err := m.begin(l); err != nil {
		return err
	}
	return m.insert(salt, keys, nil, tier, l)
}

// Commit ends the writes Insert asked of the caller: with err nil the blocks
// become ready (and, with WriteThrough, are copied on to the next tier);
// otherwise their slots are freed and they are forgotten. The caller MUST
// have finished writing (the kernel or copy that wrote them completed); a
// server that has only enqueued the writes calls CommitAfter.
func (m *Manager) Commit(l *Lease, err error) error {
	return m.commit("Commit", l, err, nil)
}

// CommitAfter is Commit for writes that are enqueued on the device and
// marked by written (the event the server recorded after the step that
// produced the KV), so that nothing on the request's path waits on the
// host: the blocks are ready in device order. Every copy kvtier makes of
// them until l is released (write-through now, Offload or Evict later, by
// any lease) waits for written on the device, and Release returns their
// slots for reuse only once written has completed. written MUST NOT be
// destroyed or recorded again before it has completed and l has been
// released. Work of the server that reads them MUST be
// ordered after written (the same stream, or a wait on the event); a
// lookup by another request finds them at once, so a server with several
// compute streams orders them the same way.
func (m *Manager) CommitAfter(l *Lease, written Event) error {
	if written == nil {
		return fmt.Errorf("%w: CommitAfter: nil event (use Commit)", ErrBadInput)
	}
	return m.commit("CommitAfter", l, nil, written)
}

func (m *Manager) commit(op string, l *Lease, err error, written Event) error {
	if !l.leased || l.m != m {
		return fmt.Errorf("%w: %s: lease holds no insert of this manager", ErrBadInput, op)
	}
	m.lock()
	var b *Batch // write-through copies that wait for written
	for i := range l.Blocks {
		bl := &l.Blocks[i]
		if !bl.Write {
			continue
		}
		bl.Write = false
		r := m.recs.at(bl.Ref)
		if r.state[bl.Tier] != stateWriting || r.slot[bl.Tier] != bl.Slot {
			m.unlock()
			panic(fmt.Sprintf("kvtier: %s: block %#x in %v is %v", op, uint64(bl.Key), bl.Tier, r.state[bl.Tier]))
		}
		if err == nil {
			m.setState(bl.Ref, bl.Tier, stateReady)
			m.metrics.tier(bl.Tier).in(m.tiers[bl.Tier].slotBytes)
			if written != nil {
				l.written = written
				if bl.Tier == GPU {
					m.gpuWritten[bl.Slot] = written
				}
			}
			if m.writeThrough {
				if b == nil {
					b = m.newTransfer(l)
				}
				m.propagateIn(b, bl.Ref, bl.Tier)
			}
		} else {
			m.freeSlot(bl.Ref, bl.Tier)
		}
	}
	m.unlockAndSubmit(b)
	return nil
}

// Offload submits copies of the leased blocks into tier to (Host or NVMe)
// from their fastest ready tier above it, for blocks not yet there and
// admitted by the tier's Admitter. It stops at the first block for which no
// slot is free now. The copies are done when Wait returns nil.
func (m *Manager) Offload(l *Lease, to Tier) error {
	if err := m.checkTier("Offload", to); err != nil {
		return err
	}
	if !l.leased || l.m != m {
		return fmt.Errorf("%w: Offload: lease holds no blocks of this manager", ErrBadInput)
	}
	m.lock()
	m.settle(l)
	var t *Batch
	ts := &m.tiers[to]
	for i := range l.Blocks {
		want := len(l.Blocks) - i
		b := &l.Blocks[i]
		r := m.recs.at(b.Ref)
		from := r.best()
		if from >= to || r.state[to] != stateNone {
			continue
		}
		if ts.admitter != nil && !ts.admitter.Admit(b.Key) {
			continue
		}
		slot, ok := m.alloc(to, want)
		if !ok {
			break
		}
		if t == nil {
			t = m.newTransfer(l)
		}
		m.startCopy(t, b.Ref, from, to, slot)
	}
	m.unlockAndSubmit(t)
	return nil
}

// Promote copies the leased blocks whose fastest ready copy is in a tier
// slower than to into tier to (Host, say, for NVMe hits), so that a later
// Onboard loads them from there: a server prefetches a request's later
// blocks into the host while its first ones load into the GPU, and the
// promoted blocks stay in the host tier under its policy. Blocks already
// in to or faster, and blocks for which no slot is free now, are skipped;
// the tier's Admitter is not asked (the request wants them). The copies are
// done when Wait returns nil; Onboard, before or after, loads each block
// from its fastest ready tier at the time.
func (m *Manager) Promote(l *Lease, to Tier) error {
	if err := m.checkTier("Promote", to); err != nil {
		return err
	}
	if to == GPU {
		return fmt.Errorf("%w: Promote: into the gpu tier is Onboard", ErrBadInput)
	}
	if !l.leased || l.m != m {
		return fmt.Errorf("%w: Promote: lease holds no blocks of this manager", ErrBadInput)
	}
	m.lock()
	m.settle(l)
	var t *Batch
	for i := range l.Blocks {
		b := &l.Blocks[i]
		r := m.recs.at(b.Ref)
		from := r.best()
		if from == NumTiers || from <= to || r.state[to] != stateNone {
			continue
		}
		slot, ok := m.alloc(to, len(l.Blocks)-i)
		if !ok {
			break
		}
		if t == nil {
			t = m.newTransfer(l)
		}
		m.startCopy(t, b.Ref, from, to, slot)
	}
	m.unlockAndSubmit(t)
	return nil
}

// Wait blocks until every copy Onboard and Offload submitted for l has
// completed, and returns the first failure among them (wrapping ErrMove and
// naming the block and tiers), or ctx's error.
func (m *Manager) Wait(ctx context.Context, l *Lease) error {
	for {
		m.lock()
		if l.xfers == 0 {
			err := l.err
			l.err = nil
			m.unlock()
			return err
		}
		done := l.done
		m.unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
