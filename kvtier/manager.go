package kvtier

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"kvtier.dev/internal/invariants"
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
	events     *eventLog // nil: no event stream
	ten        *tenants  // nil: no Config.Tenants, one policy per tier
	pins       pins
	// admitters is set when a tier has an Admitter; lookups then keep
	// their keys so that Release can record them.
	admitters bool

	// busy counts the batches not yet finished and the releases waiting
	// for a CommitAfter event; drained, when set, is closed when busy
	// reaches 0 (Drain waits on it).
	busy    int
	drained chan struct{}

	// copiesFrom[t] are the copies in flight that read tier t,
	// copiedFrom[t] those that ended; copyWaiters wait for them
	// (WaitCopiesFrom).
	copiesFrom  [NumTiers]int
	copiedFrom  [NumTiers]uint64
	copyWaiters []copyWaiter

	bg      *Batch   // copies decided under mu, submitted after unlock
	xpool   []*Batch // idle transfers
	ops     uint64   // mutations, for sampled invariant checks
	hashBuf []byte   // blockTokenHash's scratch (big-endian machines)

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
	gate      WriteGate
	evictable func(BlockRef) bool
	atLevel   func(BlockRef) bool // evictable and of priority pins.level
	below     Tier                // next present tier, or NumTiers
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
	if m.ten, err = newTenants(&cfg, slots); err != nil {
		return nil, err
	}
	m.pins.now = cfg.Now
	if m.pins.now == nil {
		m.pins.now = time.Now
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
		ts.admitter, ts.gate = tc.Admitter, tc.Gate
		m.admitters = m.admitters || tc.Admitter != nil
		ts.evictable = func(v BlockRef) bool { return m.recs.at(v).evictableIn(t) }
		ts.atLevel = func(v BlockRef) bool {
			r := m.recs.at(v)
			return m.priorityOf(v, r) == m.pins.level && r.evictableIn(t)
		}
		below = t
	}
	if cfg.EventBuffer > 0 {
		m.events = newEventLog(cfg.EventBuffer, cfg.BlockTokens)
		for t := range NumTiers {
			if m.tiers[t].present {
				m.events.add(eventRec{kind: TierCleared, tier: t}, nil)
			}
		}
		m.events.release()
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

// Lookup finds the longest prefix of tokens' full blocks that is ready in some
// tier, verified token by token, and leases it: l.Blocks[i] is block i with
// its fastest ready tier and slot, not evicted until the caller calls
// Release(l), which it MUST do. l MUST NOT hold a lease.
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

// LookupKeys is Lookup for callers that computed the block keys themselves,
// chained so that equal keys mean equal prefixes; hits are verified by salt,
// parent key and position.
func (m *Manager) LookupKeys(salt Salt, keys []Key, l *Lease) error {
	if err := m.begin(l); err != nil {
		return err
	}
	l.keys = append(l.keys[:0], keys...)
	m.lookup(salt, keys, nil, l)
	l.tokens = len(keys) * m.blockTokens
	return nil
}

// Plan asks the Planner what to do with each block of the looked-up request,
// seeing the whole request (the blocks missing, the partial last block) and
// the Mover's backlog (Backlogger), and stores its answer in l.Blocks[i].Action
// and l.Estimate(). If the planner fails, Plan keeps LoadAll's answer and
// returns the error.
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

// Onboard submits copies into GPU slots (evicting as needed) for the leased
// blocks whose Action is Load, setting their Loading and GPUSlot; they are done
// when Wait returns nil, layer by layer as LayerEvents complete. A block it
// cannot load now becomes Recompute, with Why (Onboard never waits).
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
			slot, ok = m.alloc(GPU, want+1, r.salt)
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
// missing get a reserved slot and Write set: the caller MUST write their KV
// and then Commit. It stops at the first block it cannot hold (a key taken,
// or ErrNoSpace). l MUST NOT hold a lease.
func (m *Manager) Insert(salt Salt, tokens []int32, tier Tier, l *Lease) error {
	if err := m.checkTier("Insert", tier); err != nil {
		return err
	}
	if err := m.begin(l); err != nil {
		return err
	}
	l.keys, l.hashes, l.buf = appendKeysHashes(l.keys[:0], l.hashes[:0], l.buf, m.blockTokens, salt, tokens)
	m.hook(l.keys)
	return m.insert(salt, l.keys, tokens, l.hashes, tier, l)
}

// InsertKeys is Insert for callers that computed the block keys themselves.
func (m *Manager) InsertKeys(salt Salt, keys []Key, tier Tier, l *Lease) error {
	if err := m.checkTier("InsertKeys", tier); err != nil {
		return err
	}
	if err := m.begin(l); err != nil {
		return err
	}
	return m.insert(salt, keys, nil, nil, tier, l)
}

// Commit ends the writes Insert asked of the caller, which MUST have
// finished them: with err nil the blocks become ready (with WriteThrough,
// copied on to the next tier); otherwise they are freed and forgotten.
func (m *Manager) Commit(l *Lease, err error) error {
	return m.commit("Commit", l, err, nil)
}

// CommitAfter is Commit for writes enqueued on the device and marked by
// written: the blocks are ready in device order, copies out of them wait for
// written on the device, and their slots are reused only once it completed.
// written MUST NOT be destroyed or recorded again before then.
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
			invariants.Failf("kvtier: %s: block %#x in %v is %v", op, uint64(bl.Key), bl.Tier, r.state[bl.Tier])
		}
		if err == nil {
			m.setState(bl.Ref, bl.Tier, stateReady)
			m.metrics.tier(bl.Tier).in(m.tiers[bl.Tier].slotBytes)
			m.tenantTier(r, bl.Tier).in(m.tiers[bl.Tier].slotBytes)
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
// from their fastest ready tier above it, for blocks not there yet and
// admitted, until the first with no free slot now; done when Wait returns nil.
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
	for i := range l.Blocks {
		want := len(l.Blocks) - i
		b := &l.Blocks[i]
		r := m.recs.at(b.Ref)
		from := r.best()
		if from >= to || r.state[to] != stateNone {
			continue
		}
		if !m.admitWrite(to, r) {
			continue
		}
		slot, ok := m.alloc(to, want, r.salt)
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

// Promote copies the leased blocks whose fastest ready copy is slower than
// tier to into it (Host for NVMe hits, say), skipping those with no free slot
// now; the Admitter is not asked. The copies are done when Wait returns nil.
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
		slot, ok := m.alloc(to, len(l.Blocks)-i, r.salt)
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
