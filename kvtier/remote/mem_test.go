package remote

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// memStore is a Store in a map, with a switch that makes every call fail.
type memStore struct {
	mu   sync.Mutex
	m    map[string][]byte
	down bool
}

var errDown = errors.New("memStore: down")

func newMemStore() *memStore { return &memStore{m: map[string][]byte{}} }

func (s *memStore) setDown(d bool) { s.mu.Lock(); s.down = d; s.mu.Unlock() }

func (s *memStore) Get(_ context.Context, ops []GetOp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range ops {
		op := &ops[i]
		op.Err = nil
		if s.down {
			op.Err = errDown
			continue
		}
		for k, key := range op.Keys {
			v, ok := s.m[key]
			if !ok {
				op.Got[k] = -1
				continue
			}
			op.Got[k] = len(v)
			if len(v) <= len(op.Dst[k]) {
				copy(op.Dst[k], v)
			}
		}
	}
}

func (s *memStore) Put(_ context.Context, ops []PutOp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range ops {
		ops[i].Err = nil
		if s.down {
			ops[i].Err = errDown
			continue
		}
		for k, key := range ops[i].Keys {
			s.m[key] = bytes.Clone(ops[i].Values[k])
		}
	}
}

func (s *memStore) Exists(_ context.Context, keys []string, found []bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return errDown
	}
	for i, k := range keys {
		_, found[i] = s.m[k]
	}
	return nil
}

func (s *memStore) Delete(_ context.Context, keys []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return errDown
	}
	for _, k := range keys {
		delete(s.m, k)
	}
	return nil
}

func (s *memStore) Close() error { return nil }

// TestConcurrentPutGetClose: writers and readers on overlapping blocks; a
// hit always has the block's bytes, and Close with Puts in flight neither
// hangs nor races (run with -race -count=50).
func TestConcurrentPutGetClose(t *testing.T) {
	const size, blocks = 512, 16
	c, err := New(Config{Store: newMemStore(), BlockBytes: size, PartBytes: 200, QueueBlocks: 4, Writers: 2})
	if err != nil {
		t.Fatal(err)
	}
	metas, payloads := make([]BlockMeta, blocks), make([][]byte, blocks)
	for i := range blocks {
		metas[i], payloads[i] = block(i, size, 29)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				j := (g*7 + i) % blocks
				if _, err := c.Put(metas[j], payloads[j]); err != nil && !errors.Is(err, ErrClosed) {
					t.Error(err)
				}
				ops := []ReadOp{{Meta: metas[(j+3)%blocks], Dst: make([]byte, size)}}
				c.Get(context.Background(), ops)
				if ops[0].Err == nil && !bytes.Equal(ops[0].Dst, payloads[(j+3)%blocks]) {
					t.Error("a hit with wrong bytes")
				}
				if ops[0].Err != nil && !errors.Is(ops[0].Err, ErrMiss) {
					t.Error(ops[0].Err)
				}
			}
		})
	}
	wg.Go(func() { c.Flush(context.Background()) })
	time.Sleep(time.Millisecond)
	c.Close()
	wg.Wait()
	s := c.Stats()
	if s.Queued != s.Written+s.Deduplicated+s.DroppedOpen+s.WriteErrors+s.Rejected {
		t.Fatalf("queued blocks unaccounted for: %+v", s)
	}
}

// TestBreakerOpensAndCloses on a store that goes down and up, with a
// clock the test moves.
func TestBreakerOpensAndCloses(t *testing.T) {
	st := newMemStore()
	var mu sync.Mutex
	now := time.Unix(0, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	c := newCache(t, Config{Store: st, BlockBytes: 64, BreakerFailures: 2, BreakerCooldown: time.Second, Now: clock})
	m, p := block(0, 64, 31)
	c.Put(m, p)
	flush(t, c)
	read := func() error {
		ops := []ReadOp{{Meta: m, Dst: make([]byte, 64)}}
		c.Get(context.Background(), ops)
		return ops[0].Err
	}
	st.setDown(true)
	for range 2 {
		if err := read(); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("store down: %v", err)
		}
	}
	if s := c.Stats(); !s.BreakerOpen || s.BreakerOpens != 1 || s.Failed != 2 {
		t.Fatalf("after 2 failures: %+v", s)
	}
	st.setDown(false)
	if err := read(); !errors.Is(err, ErrUnavailable) || c.Stats().Refused != 1 {
		t.Fatalf("open, before the cooldown: %v, %+v", err, c.Stats())
	}
	if q, _ := c.Put(m, p); q || c.Stats().DroppedOpen != 1 {
		t.Fatalf("Put while open: queued %v, %+v", q, c.Stats())
	}
	// After the cooldown one probe goes through; down again, it reopens.
	advance(time.Second)
	st.setDown(true)
	if err := read(); !errors.Is(err, ErrUnavailable) || c.Stats().BreakerOpens != 2 {
		t.Fatalf("a failed probe: %v, %+v", err, c.Stats())
	}
	advance(time.Second)
	st.setDown(false)
	if err := read(); err != nil {
		t.Fatalf("a good probe: %v", err)
	}
	if s := c.Stats(); s.BreakerOpen || s.BreakerCloses != 1 {
		t.Fatalf("after a good probe: %+v", s)
	}
	// A write that fails counts towards opening, and keeps no buffer.
	st.setDown(true)
	m2, p2 := block(1, 64, 31)
	c.Put(m2, p2)
	flush(t, c)
	if s := c.Stats(); s.WriteErrors != 1 {
		t.Fatalf("a failed write: %+v", s)
	}
}

// TestBreakerLostProbe: a probe that never reports (a call that hangs)
// keeps the breaker half open for its limit only; then the next call
// probes, and its success closes the breaker. The lost probe's late
// failure reopens it, as any failed probe does.
func TestBreakerLostProbe(t *testing.T) {
	now := time.Unix(0, 0)
	b := newBreaker(1, time.Second, 4*time.Second, func() time.Time { return now })
	b.failure()
	if b.allow() {
		t.Fatal("open, before the cooldown: a call goes through")
	}
	now = now.Add(time.Second)
	if !b.allow() {
		t.Fatal("after the cooldown: no probe")
	}
	// The probe hangs: nothing reports.
	now = now.Add(3 * time.Second)
	if b.allow() {
		t.Fatal("a second probe before the first's limit")
	}
	now = now.Add(time.Second)
	if !b.allow() {
		t.Fatal("the first probe's limit past: no new probe, the tier stays off")
	}
	if b.allow() {
		t.Fatal("two probes at once")
	}
	b.success()
	if s, opens, closes := b.snapshot(); s != closed || opens != 1 || closes != 1 {
		t.Fatalf("after the new probe's success: %v, %d opens, %d closes; want closed, 1, 1", s, opens, closes)
	}
	b.failure() // the lost probe fails at last: one failure of Failures 1
	if s, opens, _ := b.snapshot(); s != open || opens != 2 {
		t.Fatalf("after the lost probe's late failure: %v, %d opens; want open, 2", s, opens)
	}
}
