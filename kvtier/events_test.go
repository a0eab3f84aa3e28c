package kvtier

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// eventIndex is what a router builds from the events: the blocks ready in
// each tier. It fails on an event that contradicts what it holds (a block
// stored twice, one removed that was not there, a gap in the numbers).
type eventIndex struct {
	t     testing.TB
	bt    int
	last  uint64
	ready map[indexedBlock]BlockEvent
}

type indexedBlock struct {
	tier Tier
	salt Salt
	key  Key
}

func newEventIndex(t testing.TB, bt int) *eventIndex {
	return &eventIndex{t: t, bt: bt, ready: map[indexedBlock]BlockEvent{}}
}

func (x *eventIndex) apply(evs []BlockEvent) {
	x.t.Helper()
	for _, ev := range evs {
		if ev.Seq != x.last+1 {
			x.t.Errorf("event %d after %d: a gap with nothing lost", ev.Seq, x.last)
		}
		x.last = ev.Seq
		b := indexedBlock{ev.Tier, ev.Salt, ev.Key}
		switch ev.Kind {
		case TierCleared:
			for k := range x.ready {
				if k.tier == ev.Tier {
					delete(x.ready, k)
				}
			}
		case BlockStored:
			if _, ok := x.ready[b]; ok {
				x.t.Errorf("event %d: block %#x stored in %v twice", ev.Seq, uint64(ev.Key), ev.Tier)
			}
			if ev.NumTokens != x.bt || ev.FirstToken%x.bt != 0 || (ev.Tokens != nil && len(ev.Tokens) != x.bt) {
				x.t.Errorf("event %d: tokens [%d, +%d) with %d ids for %d-token blocks", ev.Seq, ev.FirstToken, ev.NumTokens, len(ev.Tokens), x.bt)
			}
			ev.Tokens = slices.Clone(ev.Tokens)
			x.ready[b] = ev
		case BlockRemoved:
			if _, ok := x.ready[b]; !ok {
				x.t.Errorf("event %d: block %#x removed from %v where it was not", ev.Seq, uint64(ev.Key), ev.Tier)
			}
			delete(x.ready, b)
		default:
			x.t.Errorf("event %d: kind %v", ev.Seq, ev.Kind)
		}
	}
}

// follow reads s until the index has every event the manager made so far.
func (x *eventIndex) follow(m *Manager, s *Subscription) {
	x.t.Helper()
	for x.last < m.EventStats().Last {
		evs, err := s.Next(context.Background())
		if err != nil {
			x.t.Fatal(err)
		}
		x.apply(evs)
	}
}

// matches compares the index with the manager's blocks, ready per tier.
func (x *eventIndex) matches(m *Manager) {
	x.t.Helper()
	want := map[indexedBlock]BlockInfo{}
	m.Range(func(b BlockInfo) bool {
		for t := range NumTiers {
			if b.Ready[t] {
				want[indexedBlock{t, b.Salt, b.Key}] = b
			}
		}
		return true
	})
	for k, b := range want {
		ev, ok := x.ready[k]
		if !ok {
			x.t.Errorf("block %#x (salt %d) is ready in %v but was never announced", uint64(k.key), k.salt, k.tier)
			continue
		}
		if ev.Parent != b.Parent || ev.FirstToken != b.Position*x.bt {
			x.t.Errorf("block %#x: announced parent %#x, first token %d; the manager has %#x, position %d", uint64(k.key), uint64(ev.Parent), ev.FirstToken, uint64(b.Parent), b.Position)
		}
	}
	for k := range x.ready {
		if _, ok := want[k]; !ok {
			x.t.Errorf("block %#x (salt %d) announced in %v is not ready there", uint64(k.key), k.salt, k.tier)
		}
	}
}

// followEvents indexes m's events in a goroutine from its first event on;
// the function it returns, called once m is at rest, checks that the index
// matches m's blocks and that nothing was lost.
func followEvents(t *testing.T, m *Manager) func() {
	s, err := m.Subscribe(1)
	if err != nil {
		t.Fatal(err)
	}
	x := newEventIndex(t, m.BlockTokens())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			evs, err := s.Next(ctx)
			if err != nil {
				return
			}
			x.apply(evs)
		}
	}()
	return func() {
		cancel()
		<-done
		x.follow(m, s)
		if lost := s.Lost(); lost != 0 {
			t.Errorf("the index lost %d events", lost)
		}
		s.Close()
		x.matches(m)
	}
}

func eventsManager(t testing.TB, gpu, host, buffer int, writeThrough bool) (*Manager, *fakeMover) {
	f := newFakeMover()
	cfg := Config{BlockTokens: 2, Mover: f, WriteThrough: writeThrough, EventBuffer: buffer}
	cfg.Tiers[GPU] = tierCfg(t, gpu)
	cfg.Tiers[Host] = tierCfg(t, host)
	return mustNew(t, cfg), f
}

func kinds(evs []BlockEvent) string {
	s := ""
	for _, ev := range evs {
		s += fmt.Sprintf("%d:%v/%v ", ev.Seq, ev.Kind, ev.Tier)
	}
	return s
}

func TestEventsOfInsertDemoteEvictInvalidate(t *testing.T) {
	m, f := eventsManager(t, 2, 4, 64, false)
	s, err := m.Subscribe(1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	x := newEventIndex(t, 2)
	ctx := context.Background()
	evs, err := s.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(evs); got != "1:TierCleared/gpu 2:TierCleared/host " {
		t.Fatalf("a new manager's events: %s", got)
	}
	x.apply(evs)

	a := toks(2, 2, 100)
	insertReady(t, m, 7, a, GPU)
	evs, _ = s.Next(ctx)
	if got := kinds(evs); got != "3:BlockStored/gpu 4:BlockStored/gpu " {
		t.Fatalf("an insert of two blocks: %s", got)
	}
	if evs[1].Salt != 7 || evs[1].Parent != evs[0].Key || evs[0].Parent != 0 || evs[1].FirstToken != 2 ||
		evs[1].NumTokens != 2 || !slices.Equal(evs[1].Tokens, a[2:4]) {
		t.Fatalf("the second block's event: %+v (first %+v)", evs[1], evs[0])
	}
	x.apply(evs)

	// Write-back: the next insert demotes both (removed from the GPU as the
	// copies start, stored in the host as they complete).
	b := toks(2, 2, 200)
	var l Lease
	if err := m.Insert(7, b, GPU, &l); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("insert into a GPU tier of blocks being demoted: %v", err)
	}
	m.Release(&l)
	f.drain()
	insertReady(t, m, 7, b, GPU)
	x.follow(m, s)
	x.matches(m)
	if n := len(x.ready); n != 4 {
		t.Fatalf("%d blocks announced ready, want 2 in the GPU and 2 in the host", n)
	}

	// A demotion that fails puts the block back in the GPU: stored again.
	c := toks(1, 2, 300)
	if err := m.Insert(7, c, GPU, &l); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("insert: %v", err)
	}
	m.Release(&l)
	for f.completeOne(rand.New(rand.NewPCG(1, 1)), true) {
	}
	x.follow(m, s)
	x.matches(m)

	// Invalidate announces the removal at once, though the block is in use.
	var held Lease
	if err := m.Lookup(7, a, &held); err != nil || held.Len() != 2 {
		t.Fatalf("lookup: %d, %v", held.Len(), err)
	}
	if n, err := m.Invalidate(7, a); err != nil || n != 2 {
		t.Fatalf("Invalidate: %d, %v", n, err)
	}
	x.follow(m, s)
	x.matches(m)
	m.Release(&held)
	if n := m.InvalidateSalt(7); n != 2 {
		t.Fatalf("InvalidateSalt: %d", n)
	}
	x.follow(m, s)
	x.matches(m)
	if len(x.ready) != 0 {
		t.Fatalf("after InvalidateSalt the index holds %d blocks", len(x.ready))
	}
	if last := m.EventStats().Last; last != x.last {
		t.Fatalf("the manager made %d events, the subscriber read %d", last, x.last)
	}
}

// TestEventsSlowSubscriberLosesCounted: a subscriber that does not read
// while the manager makes more events than the ring holds stalls nothing,
// then sees a gap in the numbers equal to Lost.
func TestEventsSlowSubscriberLosesCounted(t *testing.T) {
	m, _ := eventsManager(t, 64, 64, 8, false)
	slow, err := m.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	start := m.EventStats().Last
	for i := range 10 {
		insertReady(t, m, 1, toks(2, 2, int32(10*i)), GPU) // 2 events each
	}
	st := m.EventStats()
	if st.Last != start+20 {
		t.Fatalf("%d events after 10 inserts of 2 blocks, want %d", st.Last, start+20)
	}
	evs, err := slow.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 8 || evs[0].Seq != st.Last-7 || evs[7].Seq != st.Last {
		t.Fatalf("the slow subscriber got %s; want the ring's last 8 events", kinds(evs))
	}
	if lost := slow.Lost(); lost != 12 || evs[0].Seq-(start+1) != lost {
		t.Fatalf("lost %d, gap %d: want 12 of each", lost, evs[0].Seq-(start+1))
	}
	if st := m.EventStats(); st.Lost != 12 || st.Subscribers != 1 || st.Buffer != 8 {
		t.Fatalf("stats %+v", st)
	}
}

func TestEventsBadInput(t *testing.T) {
	m := oneTier(t, GPU, 4, 2)
	if _, err := m.Subscribe(0); !errors.Is(err, ErrBadInput) {
		t.Fatalf("Subscribe with the stream off: %v", err)
	}
	if st := m.EventStats(); st != (EventStats{}) {
		t.Fatalf("stats with the stream off: %+v", st)
	}
	for _, n := range []int{-1, maxEventBuffer + 1, maxEventBufferToken} {
		cfg := Config{BlockTokens: 2, EventBuffer: n}
		cfg.Tiers[GPU] = tierCfg(t, 4)
		if _, err := New(cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "EventBuffer") {
			t.Errorf("EventBuffer %d: %v", n, err)
		}
	}
	m, _ = eventsManager(t, 4, 4, 16, false)
	last := m.EventStats().Last
	if _, err := m.Subscribe(last + 2); !errors.Is(err, ErrBadInput) {
		t.Fatalf("Subscribe past the next event: %v", err)
	}
	if st := m.EventStats(); st.Subscribers != 0 {
		t.Fatalf("a refused Subscribe left %d subscribers", st.Subscribers)
	}
	s, err := m.Subscribe(last + 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if _, err := s.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next with nothing new: %v", err)
	}
	s.Close()
	s.Close()
	if _, err := s.Next(context.Background()); !errors.Is(err, ErrBadInput) {
		t.Fatalf("Next after Close: %v", err)
	}
	if st := m.EventStats(); st.Subscribers != 0 {
		t.Fatalf("%d subscribers after Close", st.Subscribers)
	}
}

// TestEventsWakeAWaitingSubscriber: Next waits for the next event, which
// another goroutine makes.
func TestEventsWakeAWaitingSubscriber(t *testing.T) {
	m, _ := eventsManager(t, 4, 4, 16, false)
	s, err := m.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := make(chan []BlockEvent, 1)
	go func() {
		evs, err := s.Next(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- slices.Clone(evs)
	}()
	insertReady(t, m, 1, toks(1, 2, 5), GPU)
	evs := <-got
	if len(evs) != 1 || evs[0].Kind != BlockStored || evs[0].Tier != GPU {
		t.Fatalf("the waiting subscriber got %s", kinds(evs))
	}
}

// BenchmarkInsertEvictEvents is BenchmarkInsertEvict with the event stream
// on: each block inserted makes a stored event and its victim a removed
// one. Reported per block: with no subscriber (the writer's cost alone),
// and with one reading every event on another goroutine.
func BenchmarkInsertEvictEvents(b *testing.B) {
	for _, subscribe := range []bool{false, true} {
		name := "no-subscriber"
		if subscribe {
			name = "subscriber"
		}
		b.Run(name, func(b *testing.B) { benchInsertEvictEvents(b, subscribe) })
	}
}

func benchInsertEvictEvents(b *testing.B, subscribe bool) {
	const slots = 1 << 16
	cfg := Config{BlockTokens: 16, EventBuffer: 1 << 16}
	cfg.Tiers[GPU] = tierCfg(b, slots)
	m := mustNew(b, cfg)
	rng := rand.New(rand.NewPCG(2, 2))
	req := make([]int32, 16*16)
	fill := func() {
		for j := range req {
			req[j] = rng.Int32N(128000)
		}
	}
	for range slots / 16 {
		fill()
		insertReady(b, m, 2, req, GPU)
	}
	read := make(chan int, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if subscribe {
		s, err := m.Subscribe(0)
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		go func() {
			n := 0
			for {
				evs, err := s.Next(ctx)
				if err != nil {
					read <- n
					return
				}
				n += len(evs)
			}
		}()
	}
	first := m.EventStats().Last
	var l Lease
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 16 {
		fill()
		if err := m.Insert(3, req, GPU, &l); err != nil || l.Len() != 16 {
			b.Fatalf("%d inserted, %v", l.Len(), err)
		}
		if err := m.Commit(&l, nil); err != nil {
			b.Fatal(err)
		}
		m.Release(&l)
	}
	b.StopTimer()
	b.ReportMetric(float64(m.EventStats().Last-first)/float64(b.N), "events/op")
	if subscribe {
		cancel()
		b.ReportMetric(float64(<-read)/float64(b.N), "events-read/op")
	}
}

// TestAnnounceRemote: the remote tier's adapter announces blocks there, in
// the manager's order; a tier the manager holds, or a bad block, is refused
// and announces nothing.
func TestAnnounceRemote(t *testing.T) {
	m, _ := eventsManager(t, 4, 4, 16, false)
	s, err := m.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := BlockInfo{Key: 7, Parent: 6, Salt: 2, Position: 3}
	if err := m.Announce(BlockStored, Remote, b, []int32{1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := m.Announce(BlockRemoved, Remote, b, []int32{1, 2}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		kind   EventKind
		tier   Tier
		b      BlockInfo
		tokens []int32
	}{
		{BlockStored, GPU, b, nil},
		{TierCleared, Remote, b, nil},
		{BlockStored, Remote, BlockInfo{Key: 1, Position: -1}, nil},
		{BlockStored, Remote, b, []int32{1, 2, 3}},
	} {
		if err := m.Announce(bad.kind, bad.tier, bad.b, bad.tokens); !errors.Is(err, ErrBadInput) {
			t.Errorf("Announce(%v, %v, %+v, %v): %v", bad.kind, bad.tier, bad.b, bad.tokens, err)
		}
	}
	evs, err := s.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Kind != BlockStored || evs[0].Tier != Remote || evs[0].Key != 7 || evs[0].Parent != 6 ||
		evs[0].Salt != 2 || evs[0].FirstToken != 6 || !slices.Equal(evs[0].Tokens, []int32{1, 2}) ||
		evs[1].Kind != BlockRemoved || evs[1].Tokens != nil || Remote.String() != "remote" {
		t.Fatalf("announced %+v", evs)
	}
	off := oneTier(t, GPU, 4, 2)
	if err := off.Announce(BlockStored, Remote, b, nil); err != nil {
		t.Fatalf("Announce with the stream off: %v", err)
	}
}

// TestAnnounceWhileTheManagerWrites: announcements from another goroutine
// interleave with the manager's own events, every one numbered once.
func TestAnnounceWhileTheManagerWrites(t *testing.T) {
	m, _ := eventsManager(t, 8, 8, 1<<12, false)
	s, err := m.Subscribe(1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 300 {
			if err := m.Announce(BlockStored, Remote, BlockInfo{Key: Key(i + 1)}, nil); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i := range 300 {
		insertReady(t, m, 1, toks(1, 2, int32(2*i)), GPU) // stored, and from the 9th on an eviction
	}
	<-done
	remote, next := 0, uint64(1)
	for next <= m.EventStats().Last {
		evs, err := s.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Seq != next {
				t.Fatalf("event %d after %d", ev.Seq, next-1)
			}
			next++
			if ev.Tier == Remote {
				remote++
			}
		}
	}
	if remote != 300 || s.Lost() != 0 {
		t.Fatalf("%d remote events of 300, %d lost", remote, s.Lost())
	}
}
