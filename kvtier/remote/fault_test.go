package remote

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvtier.dev/internal/redistest"
)

// Fault tests run against a cluster of their own (they kill and stop
// nodes). Deadlines are generous (2 s per op) because a loaded CI machine
// under -race is slow; what they check is outcomes (hit with the right
// bytes, or miss; never an error, wrong bytes or a hang), not speed.

// readAll reads every block once and checks each outcome: a hit with the
// right bytes or a miss. It returns the hits.
func readAll(t *testing.T, c *Cache, metas []BlockMeta, payloads [][]byte) int {
	t.Helper()
	ops := make([]ReadOp, len(metas))
	for i := range ops {
		ops[i] = ReadOp{Meta: metas[i], Dst: make([]byte, c.BlockBytes())}
	}
	c.Get(context.Background(), ops)
	hits := 0
	for i := range ops {
		switch {
		case ops[i].Err == nil:
			if !bytes.Equal(ops[i].Dst, payloads[i]) {
				t.Errorf("block %d: a hit with wrong bytes", i)
			}
			hits++
		case !errors.Is(ops[i].Err, ErrMiss):
			t.Errorf("block %d: %v, want a hit or a miss", i, ops[i].Err)
		}
	}
	return hits
}

func TestMasterKilledDuringReadsAndWrites(t *testing.T) {
	cl := redistest.Private(t, redistest.Options{NodeTimeout: time.Second})
	st := newRedis(t, cl.Addrs())
	const size, n = 32 << 10, 24
	c := newCache(t, Config{Store: st, Prefix: "kill:", BlockBytes: size, PartBytes: 8 << 10,
		OpTimeout: 2 * time.Second, BreakerCooldown: 100 * time.Millisecond})
	metas, payloads := make([]BlockMeta, n), make([][]byte, n)
	for i := range n {
		metas[i], payloads[i] = block(i, size, 11)
		c.Put(metas[i], payloads[i])
	}
	flush(t, c)
	if err := cl.WaitReplicated(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if h := readAll(t, c, metas, payloads); h != n {
		t.Fatalf("before the kill: %d of %d hits", h, n)
	}
	victim, err := cl.MasterOf(keyNames("kill:", metas[0].Key, 0)[0])
	if err != nil {
		t.Fatal(err)
	}

	// Readers and a writer run across the kill and the failover.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads, hits atomic.Int64
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				hits.Add(int64(readAll(t, c, metas, payloads)))
				reads.Add(n)
			}
		})
	}
	wg.Go(func() {
		for i := n; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			m, p := block(i, size, 11)
			if _, err := c.Put(m, p); err != nil {
				t.Errorf("Put during the failover: %v", err)
			}
		}
	})
	time.Sleep(100 * time.Millisecond) // reads before the kill
	victim.Kill()
	if err := cl.WaitHealthy(20 * time.Second); err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	// Every block was replicated before the kill, so once the client
	// has found the promoted replica, every read hits again.
	deadline := time.Now().Add(20 * time.Second)
	for readAll(t, c, metas, payloads) != n {
		if time.Now().After(deadline) {
			t.Fatalf("20 s after the failover, some blocks still miss: %+v", c.Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	written := c.Stats().Written
	m, p := block(1000, size, 11)
	for {
		c.Put(m, p)
		flush(t, c)
		if c.Stats().Written > written {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write succeeds after the failover: %+v", c.Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	s := c.Stats()
	t.Logf("%d reads during the kill, %d hits; stats %+v", reads.Load(), hits.Load(), s)
	if s.Corrupt != 0 {
		t.Errorf("%d values read as corrupt during a failover", s.Corrupt)
	}
}

func TestPausedNodeOpensBreakerAndNothingHangs(t *testing.T) {
	// A long node timeout: the paused master is not replaced while paused.
	cl := redistest.Private(t, redistest.Options{NodeTimeout: 15 * time.Second})
	st, err := NewRedis(RedisConfig{Addrs: cl.Addrs(), ConnWriteTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	const size = 16 << 10
	op := 300 * time.Millisecond
	c := newCache(t, Config{Store: st, Prefix: "pause:", BlockBytes: size, OpTimeout: op,
		BreakerFailures: 2, BreakerCooldown: time.Second}) // a stall of the loaded machine between two reads must not reach it
	m, p := block(0, size, 13)
	c.Put(m, p)
	flush(t, c)
	if h := readAll(t, c, []BlockMeta{m}, [][]byte{p}); h != 1 {
		t.Fatal("the block misses before the pause")
	}
	victim, err := cl.MasterOf(keyNames("pause:", m.Key, 0)[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := victim.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			victim.Resume()
		}
	}()
	// Each read returns, as a miss, by its deadline: the watchdog only
	// catches a read that ignores it (30 s, far past any loaded machine's
	// delay). Two failures open the breaker, after which reads miss at once
	// and Puts are dropped without blocking.
	for i := range 4 {
		start := time.Now()
		if h := readAll(t, c, []BlockMeta{m}, [][]byte{p}); h != 0 {
			t.Fatalf("read %d hit a paused node", i)
		}
		if d := time.Since(start); d > op+30*time.Second {
			t.Fatalf("read %d took %v with a %v deadline: it did not honour it", i, d, op)
		}
	}
	s := c.Stats()
	if !s.BreakerOpen || s.BreakerOpens == 0 || s.Refused == 0 || s.Failed < 2 {
		t.Fatalf("while paused: %+v, want the breaker open and reads refused", s)
	}
	dropped := c.Stats().DroppedOpen
	for i := range 100 {
		m2, p2 := block(100+i, size, 13)
		if _, err := c.Put(m2, p2); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.Stats().DroppedOpen - dropped; got != 100 {
		t.Fatalf("%d of 100 Puts while open were dropped, want all: %+v", got, c.Stats())
	}
	if err := victim.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	deadline := time.Now().Add(15 * time.Second)
	for readAll(t, c, []BlockMeta{m}, [][]byte{p}) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("15 s after the resume the block still misses: %+v", c.Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s := c.Stats(); s.BreakerOpen || s.BreakerCloses == 0 {
		t.Fatalf("after the resume: %+v, want the breaker closed", s)
	}
}

func TestOverwrittenValueIsDetectedAndDeleted(t *testing.T) {
	addrs := redistest.Shared(t)
	st := newRedis(t, addrs)
	prefix := uniquePrefix(t)
	const size = 8 << 10
	c := newCache(t, Config{Store: st, Prefix: prefix, BlockBytes: size, PartBytes: 4 << 10})
	for _, target := range []int{0, 1, 2} { // header, first part, second part
		m, p := block(target, size, 17)
		c.Put(m, p)
		flush(t, c)
		keys := keyNames(prefix, m.Key, 2)
		// A plain client overwrites one value with other bytes of the
		// same length.
		other := bytes.Repeat([]byte{0x5a}, map[int]int{0: HeaderBytes, 1: 4 << 10, 2: 4 << 10}[target])
		cmd := st.Client().B().Set().Key(keys[target]).Value(string(other)).Build()
		if err := st.Client().Do(context.Background(), cmd).Error(); err != nil {
			t.Fatal(err)
		}
		before := c.Stats().Corrupt
		if h := readAll(t, c, []BlockMeta{m}, [][]byte{p}); h != 0 {
			t.Fatalf("value %d overwritten: read as a hit", target)
		}
		if c.Stats().Corrupt != before+1 {
			t.Fatalf("value %d overwritten: not counted as corrupt: %+v", target, c.Stats())
		}
		found := make([]bool, len(keys))
		if err := st.Exists(context.Background(), keys, found); err != nil {
			t.Fatal(err)
		}
		for i, f := range found {
			if f {
				t.Fatalf("value %d overwritten: key %s is still there", target, keys[i])
			}
		}
	}
}

func TestFullClusterMissesNotErrors(t *testing.T) {
	cl := redistest.Private(t, redistest.Options{MaxMemory: "5mb"})
	st := newRedis(t, cl.Addrs())
	const size = 256 << 10
	c := newCache(t, Config{Store: st, Prefix: "full:", BlockBytes: size, QueueBlocks: 8, Writers: 2})
	var metas []BlockMeta
	var payloads [][]byte
	for i := range 60 { // 15 MiB into 3 masters with about 3 MiB free each
		m, p := block(i, size, 19)
		for {
			ok, err := c.Put(m, p)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				break
			}
			flush(t, c) // the queue is full: let it drain
		}
		metas, payloads = append(metas, m), append(payloads, p)
	}
	flush(t, c)
	s := c.Stats()
	if s.Rejected == 0 || s.WriteErrors != 0 || s.BreakerOpen {
		t.Fatalf("noeviction at maxmemory: %+v, want writes rejected, no errors, breaker closed", s)
	}
	hits := readAll(t, c, metas, payloads)
	if hits == 0 || hits == len(metas) {
		t.Fatalf("%d of %d blocks hit, want some: %+v", hits, len(metas), c.Stats())
	}

	// With an eviction policy, Redis makes room: writes succeed and
	// the oldest blocks (or some of their parts) go, as misses.
	for _, n := range cl.Nodes {
		if _, err := redistest.Do(n.Addr, "", "CONFIG", "SET", "maxmemory-policy", "allkeys-lru"); err != nil {
			t.Fatal(err)
		}
	}
	before := c.Stats()
	for i := 60; i < 120; i++ {
		m, p := block(i, size, 19)
		for {
			if ok, _ := c.Put(m, p); ok {
				break
			}
			flush(t, c)
		}
		metas, payloads = append(metas, m), append(payloads, p)
	}
	flush(t, c)
	hits = readAll(t, c, metas, payloads)
	s = c.Stats()
	if s.Written <= before.Written || s.WriteErrors != 0 || s.BreakerOpen || s.Failed != 0 {
		t.Fatalf("allkeys-lru at maxmemory: %+v", s)
	}
	if hits == len(metas) {
		t.Fatalf("all %d blocks hit in a 15 MiB cluster", hits)
	}
	// LRU makes room for the newest blocks (Redis's LRU is sampled, so
	// not necessarily for every one of them).
	if readAll(t, c, metas[len(metas)-8:], payloads[len(metas)-8:]) == 0 {
		t.Fatalf("the 8 newest blocks all miss under allkeys-lru: %+v", c.Stats())
	}
	t.Logf("%d of %d blocks hit; stats %+v", hits, len(metas), s)
}
