package kvevents

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"kvtier.dev/examples/server/internal/kvevents/vllmtest"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/policy"
)

const testBT = 16

// newManager is a GPU tier of slots 16-token blocks with an event ring of
// buffer events.
func newManager(t *testing.T, slots, buffer int) *kvtier.Manager {
	t.Helper()
	p, err := policy.NewDenseLRU[kvtier.BlockRef](slots)
	if err != nil {
		t.Fatal(err)
	}
	cfg := kvtier.Config{BlockTokens: testBT, EventBuffer: buffer}
	cfg.Tiers[kvtier.GPU] = kvtier.TierConfig{CapacityBytes: int64(slots) << 10, SlotBytes: 1 << 10, Policy: p}
	m, err := kvtier.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// churn inserts n requests of 4 random blocks (salt 1 to 3), ready: once
// the tier is full, each evicts others.
func churn(t *testing.T, m *kvtier.Manager, rng *rand.Rand, n int) {
	t.Helper()
	toks := make([]int32, 4*testBT)
	var l kvtier.Lease
	for range n {
		for i := range toks {
			toks[i] = rng.Int32N(128000)
		}
		if err := m.Insert(kvtier.Salt(1+rng.IntN(3)), toks, kvtier.GPU, &l); err != nil {
			t.Fatal(err)
		}
		if err := m.Commit(&l, nil); err != nil {
			t.Fatal(err)
		}
		m.Release(&l)
	}
}

func start(t *testing.T, cfg Config) (*Publisher, chan struct{}) {
	t.Helper()
	subscribed := make(chan struct{}, 16)
	cfg.onSubscribe = func() { subscribed <- struct{}{} }
	if cfg.PubAddr == "" {
		cfg.PubAddr = "127.0.0.1:0"
	}
	p, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, subscribed
}

// published waits until p has published every event m made.
func published(t *testing.T, p *Publisher, m *kvtier.Manager) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.WaitPublished(ctx, m.EventStats().Last); err != nil {
		t.Fatal(err)
	}
	return p.Stats().Messages - 1
}

// TestConsumerIndexesTheEvents: vLLM's wire format decoded by an
// independent consumer (pyzmq, msgpack) builds the index of the blocks the
// manager holds, block for block, with parents and token ids; what it
// missed before it subscribed it gets from the replay socket, so its
// sequence has no gap.
func TestConsumerIndexesTheEvents(t *testing.T) {
	m := newManager(t, 256, 1<<16)
	p, subscribed := start(t, Config{Manager: m, ReplayAddr: "127.0.0.1:0", Topic: "kv-events"})
	rng := rand.New(rand.NewPCG(1, 2))
	churn(t, m, rng, 20) // before the consumer: only a replay has these
	published(t, p, m)
	c := vllmtest.Start(t, p.Addr().String(), p.ReplayAddr().String(), "kv-events", false)
	<-subscribed
	churn(t, m, rng, 200) // evictions from the 21st request's on
	var keys []kvtier.Key
	m.Range(func(b kvtier.BlockInfo) bool { keys = append(keys, b.Key); return len(keys) < 7 })
	for _, k := range keys {
		b, _ := m.Peek(1, k) // some of them are salt 1's
		if _, err := m.InvalidateKeys(b.Salt, []kvtier.Key{k}); err != nil {
			t.Fatal(err)
		}
	}
	r := c.Until(published(t, p, m))
	if len(r.Gaps) != 0 || len(r.LiveGaps) != 0 || r.Replayed == 0 || r.Clears != 1 || r.Last != int64(p.Stats().Messages-1) {
		t.Fatalf("gaps %v, %d replayed, %d clears, last %d of %d messages", r.Gaps, r.Replayed, r.Clears, r.Last, p.Stats().Messages)
	}
	if st := p.Stats(); st.Dropped != 0 || st.Lost != 0 || st.Replays == 0 || uint64(r.Events) > st.Events {
		t.Fatalf("publisher %+v; the consumer decoded %d events", st, r.Events)
	}
	want := map[uint64]kvtier.BlockInfo{}
	m.Range(func(b kvtier.BlockInfo) bool {
		want[uint64(b.Key)] = b
		return true
	})
	got := r.Media["GPU"]
	if len(got) != len(want) || len(r.Media) != 1 {
		t.Fatalf("the consumer indexes %d blocks in %d media; the manager holds %d in the GPU tier", len(got), len(r.Media), len(want))
	}
	for h, b := range want {
		g, ok := got[h]
		if !ok {
			t.Fatalf("block %#x is in the GPU tier but not in the consumer's index", h)
		}
		parent, toks, size := g.Parent, g.TokenIDs, g.BlockSize
		wantParent := (*uint64)(nil)
		if b.Position > 0 {
			v := uint64(b.Parent)
			wantParent = &v
		}
		if (parent == nil) != (wantParent == nil) || (parent != nil && *parent != *wantParent) || size != testBT || len(toks) != testBT {
			t.Fatalf("block %#x: parent %v, %d tokens of a %d-token block; want parent %v", h, parent, len(toks), size, wantParent)
		}
	}
}

// TestSlowConsumerSeesCountedGap: a consumer that reads nothing while
// hundreds of batches go out stalls neither the manager nor the publisher:
// its connection's queue overflows, the messages it loses are counted,
// and it sees exactly that many missing from its sequence.
func TestSlowConsumerSeesCountedGap(t *testing.T) {
	m := newManager(t, 256, 1<<17)
	p, subscribed := start(t, Config{Manager: m, Topic: "kv", QueueMessages: 2})
	c := vllmtest.Start(t, p.Addr().String(), "", "kv", true)
	<-subscribed
	before := int64(published(t, p, m)) // the messages before it subscribed (the clear)
	rng := rand.New(rand.NewPCG(3, 4))
	churn(t, m, rng, 8000) // 64,000 events of about 100 bytes: past the socket buffers
	published(t, p, m)
	c.Resume()
	// The last messages may have been dropped, and the consumer would
	// learn so only from its silence limit, a wall-clock wait. Once the
	// consumer has drained its queue, one more batch goes out that nothing
	// drops: the consumer reads up to it.
	waitDrained(t, p)
	churn(t, m, rng, 1)
	last := published(t, p, m)
	r := c.Until(last)
	st := p.Stats()
	missing := int64(0)
	for _, g := range r.Gaps {
		missing += g[1] - max(g[0], before+1) + 1
	}
	if st.Dropped == 0 || uint64(missing) != st.Dropped || st.Lost != 0 {
		t.Fatalf("the publisher dropped %d messages for the slow consumer (lost %d); it found gaps %v", st.Dropped, st.Lost, r.Gaps)
	}
	t.Logf("%d messages, %d dropped for the slow consumer, in %d gaps", st.Messages, st.Dropped, len(r.Gaps))
}

// waitDrained waits until every subscriber's writer has taken all its
// queued messages, so that the next QueueMessages are not dropped.
func waitDrained(t *testing.T, p *Publisher) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // an outcome's limit, not a speed
	for {
		p.mu.Lock()
		queued := 0
		for s := range p.subs {
			queued += len(s.out)
		}
		p.mu.Unlock()
		if queued == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the consumer resumed, %d messages still wait for it", queued)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPublisherLosesBehindTheRing: events the publisher could not read in
// time cost one sequence number, so that subscribers see a gap.
func TestPublisherLosesBehindTheRing(t *testing.T) {
	m := newManager(t, 64, 4)
	rng := rand.New(rand.NewPCG(5, 6))
	churn(t, m, rng, 3) // 12 events and 1 clear: past the ring of 4 before Start
	p, _ := start(t, Config{Manager: m, ReplayAddr: "127.0.0.1:0"})
	last := published(t, p, m)
	st := p.Stats()
	if st.Lost != 9 || st.Messages != 1 || last != 0 {
		t.Fatalf("%+v, last message %d: want 9 lost and one message", st, last)
	}
	// The replay of everything returns message 1 (0 was skipped) and the end.
	z := dialZMTP(t, p.ReplayAddr().String(), "DEALER")
	z.write(appendMessage(nil, nil, []byte{0, 0, 0, 0, 0, 0, 0, 0}))
	parts, err := z.readMessage(nil)
	if err != nil || len(parts) != 3 || !bytes.Equal(parts[1], []byte{0, 0, 0, 0, 0, 0, 0, 1}) {
		t.Fatalf("replay: %q %v", parts, err)
	}
	parts, err = z.readMessage(nil)
	if err != nil || len(parts) != 3 || !bytes.Equal(parts[1], endSeq) || len(parts[2]) != 0 {
		t.Fatalf("end of replay: %q %v", parts, err)
	}
}

// dialZMTP connects to a socket as a peer of socketType.
func dialZMTP(t *testing.T, addr, socketType string) *zconn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	z, err := handshake(c, socketType, []string{"PUB", "ROUTER"})
	if err != nil {
		t.Fatal(err)
	}
	return z
}

// TestHandshakeRefusesBadPeers: a peer that is not ZMTP 3 with the NULL
// mechanism, or of a socket type that cannot talk to ours, is dropped.
func TestHandshakeRefusesBadPeers(t *testing.T) {
	m := newManager(t, 64, 64)
	p, _ := start(t, Config{Manager: m, ReplayAddr: "127.0.0.1:0"})
	plain := greeting()
	copy(plain[12:32], "PLAIN\x00\x00\x00")
	old := greeting()
	old[10] = 2
	for name, tc := range map[string]struct {
		addr string
		send []byte
	}{
		"not zmtp":      {p.Addr().String(), append([]byte("GET / HTTP/1.1\r\n\r\n"), make([]byte, 64)...)},
		"zmtp 2":        {p.Addr().String(), old},
		"plain":         {p.Addr().String(), plain},
		"pub to pub":    {p.Addr().String(), append(greeting(), appendFrame(nil, flagCommand, readyBody("PUB"))...)},
		"sub to router": {p.ReplayAddr().String(), append(greeting(), appendFrame(nil, flagCommand, readyBody("SUB"))...)},
		"no ready":      {p.Addr().String(), append(greeting(), appendFrame(nil, 0, []byte("hello"))...)},
	} {
		c, err := net.Dial("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(tc.send); err != nil {
			t.Fatal(err)
		}
		// The server's greeting and READY come first; then it hangs up.
		_, err = io.ReadAll(c)
		c.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%s: the connection stayed open", name)
		}
	}
	if _, err := handshake(pipeWith(t, []byte("junk")), "SUB", []string{"PUB"}); !errors.Is(err, errProtocol) && err == nil {
		t.Errorf("handshake with junk: %v", err)
	}
}

// pipeWith is a connection whose peer sends b and then closes.
func pipeWith(t *testing.T, b []byte) net.Conn {
	a, z := net.Pipe()
	go func() {
		io.CopyN(io.Discard, z, greetingLen)
		z.Write(b)
		z.Close()
	}()
	t.Cleanup(func() { a.Close() })
	return a
}

func TestStartRefusesBadConfig(t *testing.T) {
	if _, err := Start(Config{PubAddr: "127.0.0.1:0"}); err == nil {
		t.Error("Start without a manager")
	}
	if _, err := Start(Config{Manager: newManager(t, 4, 0), PubAddr: "127.0.0.1:0"}); !errors.Is(err, kvtier.ErrBadInput) {
		t.Errorf("Start with the event stream off: %v", err)
	}
	m := newManager(t, 4, 16)
	if _, err := Start(Config{Manager: m, PubAddr: "nowhere:x"}); err == nil {
		t.Error("Start on a bad address")
	}
	if _, err := Start(Config{Manager: m, PubAddr: "127.0.0.1:0", ReplayAddr: "nowhere:x"}); err == nil {
		t.Error("Start on a bad replay address")
	}
	if _, err := Start(Config{Manager: m, PubAddr: "127.0.0.1:0", QueueMessages: -1}); err == nil {
		t.Error("Start with a negative queue")
	}
	if st := m.EventStats(); st.Subscribers != 0 {
		t.Errorf("failed Starts left %d subscriptions", st.Subscribers)
	}
}

// TestMsgpackForms: the encodings at each form's edges, as the msgpack
// spec gives them.
func TestMsgpackForms(t *testing.T) {
	for _, tc := range []struct {
		got  []byte
		want string
	}{
		{appendUint(nil, 127), "\x7f"},
		{appendUint(nil, 128), "\xcc\x80"},
		{appendUint(nil, 256), "\xcd\x01\x00"},
		{appendUint(nil, 1<<16), "\xce\x00\x01\x00\x00"},
		{appendUint(nil, 1<<63), "\xcf\x80\x00\x00\x00\x00\x00\x00\x00"},
		{appendInt(nil, -1), "\xff"},
		{appendInt(nil, -33), "\xd0\xdf"},
		{appendInt(nil, -129), "\xd1\xff\x7f"},
		{appendInt(nil, -32769), "\xd2\xff\xff\x7f\xff"},
		{appendInt(nil, -1<<40), "\xd3\xff\xff\xff\x00\x00\x00\x00\x00"},
		{appendArrayHeader(nil, 15), "\x9f"},
		{appendArrayHeader(nil, 16), "\xdc\x00\x10"},
		{appendArrayHeader(nil, 1<<16), "\xdd\x00\x01\x00\x00"},
		{appendString(nil, "GPU"), "\xa3GPU"},
		{appendString(nil, string(make([]byte, 32)))[:2], "\xd9\x20"},
		{appendString(nil, string(make([]byte, 256)))[:3], "\xda\x01\x00"},
		{appendFloat64(nil, 1.5), "\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00"},
		{appendNil(nil), "\xc0"},
	} {
		if string(tc.got) != tc.want {
			t.Errorf("%x, want %x", tc.got, tc.want)
		}
	}
}
