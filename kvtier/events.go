package kvtier

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// The event stream tells a router what each tier can serve: a block became
// readable in a tier (BlockStored) or stopped being readable there
// (BlockRemoved), or a tier holds nothing (TierCleared). Events are
// numbered 1, 2, 3... per Manager in the order the manager made the
// changes, and kept in a ring of Config.EventBuffer events that the write
// lock fills and subscribers read at their own pace: a subscriber that
// falls more than the ring behind loses the oldest events, counted, and
// sees the gap in the numbers. The manager never waits for a subscriber.

// EventKind says what happened to a block in a tier.
type EventKind uint8

const (
	BlockStored  EventKind = iota + 1 // the block became readable in the tier
	BlockRemoved                      // it no longer is: evicted, demoted, dropped or invalidated
	TierCleared                       // the tier holds no block (a manager's first events)
)

// String names the kind, as vLLM's events do.
func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case TierCleared:
		return "TierCleared"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// BlockEvent is one event of the stream.
type BlockEvent struct {
	Seq  uint64 // 1 for a manager's first event, then one more per event
	Kind EventKind
	Tier Tier // GPU, Host, NVMe, or Remote (announced by its adapter)
	// Key, Parent (0 for a prefix's first block) and Salt identify the
	// block as a Lookup does (zero for TierCleared).
	Key, Parent Key
	Salt        Salt
	// The block covers the request's tokens [FirstToken,
	// FirstToken+NumTokens): its position times Config.BlockTokens.
	FirstToken, NumTokens int
	// Tokens are the block's token ids for BlockStored, nil where the block
	// was inserted by key. Read only, valid until the subscription's next
	// call.
	Tokens []int32
}

// Limits of the event ring, so that it stays a few MiB to a few hundred.
const (
	maxEventBuffer      = 1 << 24
	maxEventBufferToken = 1 << 26 // EventBuffer * BlockTokens
	eventChunk          = 256     // events one Next returns at most
	// eventLinger is how long Next, woken by a new event, waits for more
	// before it reads: the writer wakes a subscriber at most once per
	// linger, not once per write-locked operation (a wake can cost a
	// futex call on the writer's thread).
	eventLinger = 500 * time.Microsecond
)

// eventRec is one event in the ring; its tokens live in the ring's token
// arena at the same index.
type eventRec struct {
	key, parent Key
	salt        Salt
	pos         uint32
	kind        EventKind
	tier        Tier
	tokens      bool
}

// eventLog is the ring. The manager's writer takes mu lazily, at its first
// event under the write lock, and releases it when it unlocks (so a
// write-locked operation pays one lock, however many events it makes);
// subscribers take it to copy out at most eventChunk events.
type eventLog struct {
	mu   sync.Mutex
	held bool // the writer holds mu; read and written under the manager's write lock only
	ring []eventRec
	toks []int32 // ring[i]'s tokens: toks[i*bt : (i+1)*bt]
	bt   int
	last uint64 // the newest event's Seq; 0 before the first
	lost uint64 // events subscribers lost, all of them
	subs []*Subscription
}

func newEventLog(n, blockTokens int) *eventLog {
	size := 1
	for size < n {
		size <<= 1
	}
	return &eventLog{ring: make([]eventRec, size), toks: make([]int32, size*blockTokens), bt: blockTokens}
}

// oldest is the Seq of the oldest event still in the ring. mu.
func (e *eventLog) oldest() uint64 {
	if n := uint64(len(e.ring)); e.last > n {
		return e.last - n + 1
	}
	return 1
}

// add appends an event, taking mu if the writer does not hold it yet.
// Under the manager's write lock (or in New).
func (e *eventLog) add(rec eventRec, tokens []int32) {
	if !e.held {
		e.mu.Lock()
		e.held = true
	}
	e.put(rec, tokens)
}

// put writes the next event into the ring. mu.
func (e *eventLog) put(rec eventRec, tokens []int32) {
	e.last++
	i := int(e.last & uint64(len(e.ring)-1))
	if tokens != nil {
		rec.tokens = true
		copy(e.toks[i*e.bt:(i+1)*e.bt], tokens)
	}
	e.ring[i] = rec
}

// release ends the writer's hold, waking the subscribers that wait.
func (e *eventLog) release() {
	e.held = false
	e.wake()
	e.mu.Unlock()
}

// wake wakes the subscribers that wait. mu.
func (e *eventLog) wake() {
	for _, s := range e.subs {
		if s.waiting {
			s.waiting = false
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
	}
}

// emitBlock announces that record ref's copy in tier t became readable
// (stored) or stopped being so. Write lock; the caller checked m.events.
func (m *Manager) emitBlock(kind EventKind, t Tier, ref BlockRef) {
	r := m.recs.at(ref)
	var tok []int32
	if kind == BlockStored && r.flags&flagTokens != 0 {
		tok = m.recs.tokensOf(ref)
	}
	m.events.add(eventRec{key: r.key, parent: r.parent, salt: r.salt, pos: r.depth, kind: kind, tier: t}, tok)
}

// noteState emits the event of ref's state in tier t going from old to s:
// stored when it becomes ready, removed when it stops being ready. An
// invalidated block was announced removed when it was invalidated.
func (m *Manager) noteState(ref BlockRef, t Tier, old, s blockState) {
	if (old == stateReady) == (s == stateReady) || m.recs.at(ref).flags&flagInvalid != 0 {
		return
	}
	kind := BlockStored
	if old == stateReady {
		kind = BlockRemoved
	}
	m.emitBlock(kind, t, ref)
}

// noteInvalid announces the ready copies of a block being invalidated as
// removed. Write lock, before the flag is set.
func (m *Manager) noteInvalid(ref BlockRef) {
	r := m.recs.at(ref)
	for t := range NumTiers {
		if r.state[t] == stateReady {
			m.emitBlock(BlockRemoved, t, ref)
		}
	}
}

// Announce adds an event of the shared remote tier (Remote), which the
// manager does not hold: its adapter announces a block stored there once
// a write of it completed or found it there, or removed once it found it
// gone. b identifies the block (Peek's fields); tokens are its token ids
// or nil. The stream being off, it does nothing.
func (m *Manager) Announce(kind EventKind, t Tier, b BlockInfo, tokens []int32) error {
	switch {
	case t != Remote:
		return fmt.Errorf("%w: Announce: tier %v is the manager's to announce; only %v is not", ErrBadInput, t, Remote)
	case kind != BlockStored && kind != BlockRemoved:
		return fmt.Errorf("%w: Announce: kind %v (want BlockStored or BlockRemoved)", ErrBadInput, kind)
	case b.Position < 0 || b.Position > math.MaxUint32:
		return fmt.Errorf("%w: Announce: block %#x: position %d", ErrBadInput, uint64(b.Key), b.Position)
	case tokens != nil && len(tokens) != m.blockTokens:
		return fmt.Errorf("%w: Announce: block %#x: %d tokens in a block of %d", ErrBadInput, uint64(b.Key), len(tokens), m.blockTokens)
	}
	e := m.events
	if e == nil {
		return nil
	}
	if kind != BlockStored {
		tokens = nil
	}
	// Not under the write lock: mu alone, and held (the writer's) untouched.
	e.mu.Lock()
	e.put(eventRec{key: b.Key, parent: b.Parent, salt: b.Salt, pos: uint32(b.Position), kind: kind, tier: t}, tokens)
	e.wake()
	e.mu.Unlock()
	return nil
}

// Subscription reads a Manager's events in order (Manager.Subscribe). It
// MUST NOT be used by two goroutines at once, and MUST be closed.
type Subscription struct {
	log     *eventLog
	next    uint64 // the Seq of the next event to return
	lost    uint64
	waiting bool // Next waits for a wake (e.mu)
	wake    chan struct{}
	linger  *time.Timer
	evs     []BlockEvent
	toks    []int32
	done    bool
}

// Subscribe starts a subscription at event from, or at the next event
// with from 0. An event already gone from the ring (Config.EventBuffer)
// is lost, and counted, at the first Next. It fails when the stream is
// off or from is past the next event.
func (m *Manager) Subscribe(from uint64) (*Subscription, error) {
	e := m.events
	if e == nil {
		return nil, fmt.Errorf("%w: Subscribe: the event stream is off (Config.EventBuffer is 0)", ErrBadInput)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if from == 0 {
		from = e.last + 1
	}
	if from > e.last+1 {
		return nil, fmt.Errorf("%w: Subscribe: from %d is past the next event, %d", ErrBadInput, from, e.last+1)
	}
	s := &Subscription{log: e, next: from, wake: make(chan struct{}, 1), linger: time.NewTimer(time.Hour),
		evs: make([]BlockEvent, 0, eventChunk), toks: make([]int32, eventChunk*e.bt)}
	s.linger.Stop()
	e.subs = append(e.subs, s)
	return s, nil
}

// Next returns the events after those it returned last, in order, at most
// 256 at once, waiting until there is one or ctx ends (and, woken by a new
// event, half a millisecond more for others to batch). Their Seq runs on
// without a gap unless the subscription fell more than the ring behind:
// then the events lost are skipped and counted in Lost. The slice and the
// events' Tokens are valid until the next call.
func (s *Subscription) Next(ctx context.Context) ([]BlockEvent, error) {
	e := s.log
	for {
		e.mu.Lock()
		if s.done {
			e.mu.Unlock()
			return nil, fmt.Errorf("%w: Next: the subscription is closed", ErrBadInput)
		}
		if s.next <= e.last {
			evs := s.copyOut()
			e.mu.Unlock()
			return evs, nil
		}
		s.waiting = true
		e.mu.Unlock()
		select {
		case <-s.wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		s.linger.Reset(eventLinger)
		select {
		case <-s.linger.C:
		case <-ctx.Done():
			s.linger.Stop()
			return nil, ctx.Err()
		}
	}
}

// copyOut copies the events from s.next on into s's buffers. e.mu.
func (s *Subscription) copyOut() []BlockEvent {
	e := s.log
	if old := e.oldest(); s.next < old {
		s.lost += old - s.next
		e.lost += old - s.next
		s.next = old
	}
	n := min(e.last-s.next+1, eventChunk)
	s.evs = s.evs[:0]
	mask := uint64(len(e.ring) - 1)
	for j := range n {
		seq := s.next + j
		i := int(seq & mask)
		r := &e.ring[i]
		ev := BlockEvent{Seq: seq, Kind: r.kind, Tier: r.tier, Key: r.key, Parent: r.parent, Salt: r.salt}
		if r.kind != TierCleared {
			ev.FirstToken, ev.NumTokens = int(r.pos)*e.bt, e.bt
		}
		if r.tokens {
			dst := s.toks[int(j)*e.bt : int(j+1)*e.bt : int(j+1)*e.bt]
			copy(dst, e.toks[i*e.bt:(i+1)*e.bt])
			ev.Tokens = dst
		}
		s.evs = append(s.evs, ev)
	}
	s.next += n
	return s.evs
}

// Lost is the number of events the subscription skipped because it fell
// more than the ring behind.
func (s *Subscription) Lost() uint64 {
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	return s.lost
}

// Close ends the subscription; Next then fails.
func (s *Subscription) Close() {
	e := s.log
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.done {
		return
	}
	s.done = true
	for i, o := range e.subs {
		if o == s {
			e.subs = append(e.subs[:i], e.subs[i+1:]...)
			break
		}
	}
}

// EventStats are the event stream's counters.
type EventStats struct {
	Last        uint64 // the newest event's Seq (the number made so far)
	Lost        uint64 // events subscribers lost by falling behind, all of them
	Subscribers int
	Buffer      int // events the ring keeps
}

// EventStats returns the stream's counters (zeros when it is off).
func (m *Manager) EventStats() EventStats {
	e := m.events
	if e == nil {
		return EventStats{}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return EventStats{Last: e.last, Lost: e.lost, Subscribers: len(e.subs), Buffer: len(e.ring)}
}
