package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"kvtier.dev/kvtier"
)

// Config configures a Publisher.
type Config struct {
	// Manager is the cache whose events are published; its event stream
	// MUST be on (kvtier.Config.EventBuffer).
	Manager *kvtier.Manager
	// PubAddr is the PUB socket's TCP address (host:port; port 0 picks
	// one, see Publisher.Addr).
	PubAddr string
	// ReplayAddr, when set, is the replay (ROUTER) socket's address, and
	// ReplayBatches the messages kept for it (0 means 10,000).
	ReplayAddr    string
	ReplayBatches int
	// Topic is the first frame of every message ("" is allowed).
	Topic string
	// QueueMessages is how many messages a subscriber's connection may
	// have waiting before it loses the next ones (0 means 1,024).
	QueueMessages int
	// Logger receives connections and failures (nil: none).
	Logger *slog.Logger

	onSubscribe func() // tests: called after a subscription arrived
}

// Stats are a Publisher's counters.
type Stats struct {
	Messages    uint64 // EventBatches published (sequence numbers used)
	Events      uint64 // block events in them
	Dropped     uint64 // messages not sent to a subscriber that fell behind
	Lost        uint64 // manager events the publisher itself lost (its sequence skips one)
	Upto        uint64 // the manager's last event published or lost
	Subscribers int    // connections subscribed to a topic
	Replays     uint64 // replay requests answered
}

// Publisher publishes a Manager's events on a PUB socket and serves
// replays. Start it with Start; Close stops it.
type Publisher struct {
	cfg    Config
	log    *slog.Logger
	sub    *kvtier.Subscription
	pub    net.Listener
	replay net.Listener
	topic  []byte
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	subs  map[*subscriber]struct{}
	kept  []keptBatch // the replay ring: kept[first:] then kept[:first], oldest first
	first int
	// upto is the manager's events published or lost so far; progress
	// is closed (and replaced) each time it grows.
	upto     uint64
	progress chan struct{}
	conns    map[net.Conn]struct{}
	closed   bool // Close began: connections accepted now are closed at once

	messages, events, dropped, lost, replays atomic.Uint64
}

type keptBatch struct {
	seq     uint64
	payload []byte
}

// Start listens on cfg's addresses and publishes the manager's events from
// the oldest one its ring still holds (a new manager's first).
func Start(cfg Config) (*Publisher, error) {
	if cfg.Manager == nil {
		return nil, errors.New("kvevents: Config.Manager is nil")
	}
	if cfg.ReplayBatches < 0 || cfg.QueueMessages < 0 {
		return nil, fmt.Errorf("kvevents: Config.ReplayBatches %d or QueueMessages %d is negative", cfg.ReplayBatches, cfg.QueueMessages)
	}
	if cfg.ReplayBatches == 0 {
		cfg.ReplayBatches = 10000
	}
	if cfg.QueueMessages == 0 {
		cfg.QueueMessages = 1024
	}
	p := &Publisher{cfg: cfg, log: cfg.Logger, topic: []byte(cfg.Topic), subs: map[*subscriber]struct{}{},
		conns: map[net.Conn]struct{}{}, progress: make(chan struct{})}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	var err error
	if p.sub, err = cfg.Manager.Subscribe(1); err != nil {
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	if p.pub, err = net.Listen("tcp", cfg.PubAddr); err != nil {
		p.sub.Close()
		return nil, fmt.Errorf("kvevents: PUB address: %w", err)
	}
	if cfg.ReplayAddr != "" {
		if p.replay, err = net.Listen("tcp", cfg.ReplayAddr); err != nil {
			p.sub.Close()
			p.pub.Close()
			return nil, fmt.Errorf("kvevents: replay address: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.wg.Add(2)
	go p.acceptLoop(p.pub, p.servePub)
	go p.publishLoop(ctx)
	if p.replay != nil {
		p.wg.Add(1)
		go p.acceptLoop(p.replay, p.serveReplay)
	}
	return p, nil
}

// Addr is the PUB socket's address; ReplayAddr the replay socket's (nil
// without one).
func (p *Publisher) Addr() net.Addr { return p.pub.Addr() }

func (p *Publisher) ReplayAddr() net.Addr {
	if p.replay == nil {
		return nil
	}
	return p.replay.Addr()
}

// Stats returns the counters.
func (p *Publisher) Stats() Stats {
	p.mu.Lock()
	n := 0
	for s := range p.subs {
		s.mu.Lock()
		n += min(len(s.topics), 1)
		s.mu.Unlock()
	}
	upto := p.upto
	p.mu.Unlock()
	return Stats{Messages: p.messages.Load(), Events: p.events.Load(), Dropped: p.dropped.Load(),
		Lost: p.lost.Load(), Upto: upto, Subscribers: n, Replays: p.replays.Load()}
}

// Close stops publishing and closes the sockets and connections.
func (p *Publisher) Close() error {
	p.cancel()
	err := p.pub.Close()
	if p.replay != nil {
		err = errors.Join(err, p.replay.Close())
	}
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	p.sub.Close()
	return err
}

// acceptLoop serves each connection of l in a goroutine until l closes.
func (p *Publisher) acceptLoop(l net.Listener, serve func(net.Conn)) {
	defer p.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			serve(c)
			c.Close()
			p.mu.Lock()
			delete(p.conns, c)
			p.mu.Unlock()
		}()
	}
}

// publishLoop turns the manager's events into messages: one EventBatch
// per read of the subscription, numbered on; events lost behind the
// manager's ring cost one number, so that subscribers see a gap.
func (p *Publisher) publishLoop(ctx context.Context) {
	defer p.wg.Done()
	seq, lost := uint64(0), uint64(0)
	for {
		evs, err := p.sub.Next(ctx)
		if err != nil {
			return
		}
		if l := p.sub.Lost(); l != lost {
			p.lost.Add(l - lost)
			p.log.Warn("kvevents: the publisher fell behind the cache's event ring", "events_lost", l-lost, "skipped_seq", seq)
			lost = l
			seq++
		}
		payload := AppendBatch(nil, float64(time.Now().UnixNano())/1e9, evs)
		var seqb [8]byte
		binary.BigEndian.PutUint64(seqb[:], seq)
		msg := appendMessage(nil, p.topic, seqb[:], payload)
		p.mu.Lock()
		if len(p.kept) < p.cfg.ReplayBatches {
			p.kept = append(p.kept, keptBatch{seq: seq, payload: payload})
		} else {
			p.kept[p.first] = keptBatch{seq: seq, payload: payload}
			p.first = (p.first + 1) % len(p.kept)
		}
		for s := range p.subs {
			if !s.wants(p.topic) {
				continue
			}
			select {
			case s.out <- msg:
			default:
				p.dropped.Add(1)
			}
		}
		p.messages.Add(1)
		p.events.Add(uint64(len(evs)))
		p.upto = evs[len(evs)-1].Seq
		close(p.progress)
		p.progress = make(chan struct{})
		p.mu.Unlock()
		seq++
	}
}

// WaitPublished waits until the manager's events up to seq n have been
// published (or lost), or ctx ends: at shutdown, once the manager is at
// rest, it lets the last events out before Close.
func (p *Publisher) WaitPublished(ctx context.Context, n uint64) error {
	for {
		p.mu.Lock()
		upto, ch := p.upto, p.progress
		p.mu.Unlock()
		if upto >= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("kvevents: %d of the cache's %d events published: %w", upto, n, ctx.Err())
		}
	}
}

// subscriber is one SUB connection: its topics, and the messages waiting
// for its writer.
type subscriber struct {
	z      *zconn
	out    chan []byte
	mu     sync.Mutex
	topics map[string]int
}

func (s *subscriber) wants(topic []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for t := range s.topics {
		if strings.HasPrefix(string(topic), t) {
			return true
		}
	}
	return false
}

func (s *subscriber) subscribe(topic []byte, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := string(topic)
	if on {
		s.topics[t]++
	} else if s.topics[t] > 1 {
		s.topics[t]--
	} else {
		delete(s.topics, t)
	}
}

// servePub serves one SUB peer: its subscriptions come in (as ZMTP 3.1
// commands or 3.0 messages), the messages go out from its queue.
func (p *Publisher) servePub(c net.Conn) {
	z, err := handshake(c, "PUB", []string{"SUB", "XSUB"})
	if err != nil {
		p.log.Info("kvevents: a subscriber's handshake failed", "peer", c.RemoteAddr().String(), "err", err)
		return
	}
	s := &subscriber{z: z, out: make(chan []byte, p.cfg.QueueMessages), topics: map[string]int{}}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() { // the writer
		defer c.Close()
		for {
			select {
			case msg := <-s.out:
				if err := z.write(msg); err != nil {
					return
				}
			case <-done:
				return
			}
		}
	}()
	for {
		parts, err := z.readMessage(func(name string, data []byte) {
			switch name {
			case "SUBSCRIBE":
				s.subscribe(data, true)
				p.subscribed()
			case "CANCEL":
				s.subscribe(data, false)
			}
		})
		if err != nil {
			break
		}
		if len(parts) == 1 && len(parts[0]) > 0 && parts[0][0] <= 1 { // ZMTP 3.0 subscription
			s.subscribe(parts[0][1:], parts[0][0] == 1)
			p.subscribed()
		}
	}
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	close(done)
}

func (p *Publisher) subscribed() {
	p.log.Info("kvevents: a subscriber subscribed")
	if p.cfg.onSubscribe != nil {
		p.cfg.onSubscribe()
	}
}

// endSeq marks the end of a replay: -1 as 8 big-endian bytes.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// serveReplay answers one peer's replay requests (an 8-byte big-endian
// sequence number, after the empty delimiter a REQ peer sends): every
// kept message from that number on, then the end marker.
func (p *Publisher) serveReplay(c net.Conn) {
	z, err := handshake(c, "ROUTER", []string{"REQ", "DEALER", "ROUTER"})
	if err != nil {
		p.log.Info("kvevents: a replay peer's handshake failed", "peer", c.RemoteAddr().String(), "err", err)
		return
	}
	for {
		parts, err := z.readMessage(nil)
		if err != nil {
			return
		}
		var envelope [][]byte
		for len(parts) > 1 && len(parts[0]) == 0 {
			envelope, parts = append(envelope, parts[0]), parts[1:]
		}
		if len(parts) != 1 || len(parts[0]) != 8 {
			p.log.Info("kvevents: a replay request is not one 8-byte sequence number", "peer", c.RemoteAddr().String(), "frames", len(parts))
			continue
		}
		from := binary.BigEndian.Uint64(parts[0])
		p.mu.Lock()
		var batches []keptBatch
		for _, part := range [][]keptBatch{p.kept[p.first:], p.kept[:p.first]} {
			for _, k := range part {
				if k.seq >= from {
					batches = append(batches, k)
				}
			}
		}
		p.mu.Unlock()
		for _, k := range batches {
			var seqb [8]byte
			binary.BigEndian.PutUint64(seqb[:], k.seq)
			if err := z.write(appendMessage(nil, append(envelope, seqb[:], k.payload)...)); err != nil {
				return
			}
		}
		if err := z.write(appendMessage(nil, append(envelope, endSeq, nil)...)); err != nil {
			return
		}
		p.replays.Add(1)
	}
}
