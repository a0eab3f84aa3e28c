package kvtier

import (
	"sync"
	"testing"
	"unsafe"
)

// refsOf reads the reference counts of l's blocks without taking the write
// lock (which would turn pins into references).
func refsOf(m *Manager, l *Lease) []uint32 {
	m.readLock()
	defer m.readUnlock()
	var refs []uint32
	for _, b := range l.Blocks {
		refs = append(refs, m.recs.at(b.Ref).refs)
	}
	return refs
}

func queuedTouches(m *Manager) int {
	n := 0
	for i := range m.stripes {
		s := &m.stripes[i]
		s.bufMu.Lock()
		n += s.n
		s.bufMu.Unlock()
	}
	return n
}

func TestLookupPinsAndWritersCountReferences(t *testing.T) {
	m := oneTier(t, GPU, 4, 2)
	req := toks(3, 2, 100)
	insertReady(t, m, 0, req, GPU)
	var a, b Lease
	for _, l := range []*Lease{&a, &b} {
		if err := m.Lookup(0, req, l); err != nil || l.Len() != 3 {
			t.Fatalf("lookup: %d blocks, %v", l.Len(), err)
		}
	}
	if got := refsOf(m, &a); got[0] != 0 || got[1] != 0 || got[2] != 0 || !a.pinned || !b.pinned {
		t.Fatalf("after two lookups, refs %v and pinned %v %v: want no reference written, both pinned", got, a.pinned, b.pinned)
	}
	// A writer (here Metrics) turns the pins into references first.
	if got := m.Metrics().Tiers[GPU].InUseBlocks; got != 3 {
		t.Fatalf("InUseBlocks = %d, want 3", got)
	}
	if got := refsOf(m, &a); got[0] != 2 || a.pinned || b.pinned {
		t.Fatalf("after a writer, refs %v, pinned %v %v: want 2 references each, no pin", got, a.pinned, b.pinned)
	}
	m.Release(&a)
	// A lease pinned after the writer is released without references.
	var c Lease
	if err := m.Lookup(0, req, &c); err != nil || !c.pinned {
		t.Fatalf("lookup: %v, pinned %v", err, c.pinned)
	}
	m.Release(&c)
	if got := refsOf(m, &b); got[0] != 1 {
		t.Fatalf("refs %v after releasing one of two counted leases and a pinned one, want 1", got)
	}
	// The tier is full: an insert must evict, and may not take b's blocks.
	insertReady(t, m, 0, toks(1, 2, 900), GPU)
	if n := insertReady(t, m, 0, toks(1, 2, 1000), GPU); n != 1 {
		t.Fatalf("inserted %d blocks into a tier of 4 holding 3 in use, want 1 (evicting the 4th)", n)
	}
	if n := insertReady(t, m, 0, toks(2, 2, 2000), GPU); n != 1 {
		t.Fatalf("inserted %d of 2 blocks into a tier of 4 holding 3 in use, want 1", n)
	}
	m.Release(&b)
	if got := m.Metrics().Tiers[GPU]; got.InUseBlocks != 0 || got.ResidentBlocks != 4 {
		t.Fatalf("after all releases: %+v", got)
	}
	if lookupLen(t, m, 0, req) != 3 {
		t.Fatal("a block in use was evicted")
	}
	m.check(t)
}

// A pinned lease is safe against a writer that runs while other goroutines
// pin and unpin on every stripe.
func TestPinsUnderConcurrentEviction(t *testing.T) {
	m := oneTier(t, GPU, 16, 2)
	req := toks(4, 2, 0)
	var wg sync.WaitGroup
	for g := range 2 * len(m.stripes) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var l Lease
			for i := range 200 {
				if g == 0 {
					insertReady(t, m, 0, toks(4, 2, int32(1000+8*i)), GPU)
					continue
				}
				if err := m.Lookup(0, req, &l); err != nil {
					t.Error(err)
					return
				}
				// Whatever the lease holds must stay resident while held.
				m.readLock()
				for _, b := range l.Blocks {
					if r := m.recs.at(b.Ref); r.state[GPU] != stateReady || r.key != b.Key {
						t.Errorf("leased block %#x is %v (key %#x)", uint64(b.Key), r.state[GPU], uint64(r.key))
					}
				}
				m.readUnlock()
				m.Release(&l)
				if i%50 == 0 {
					insertReady(t, m, 0, req, GPU)
				}
			}
		}()
	}
	wg.Wait()
	if mt := m.Metrics(); mt.Tiers[GPU].InUseBlocks != 0 || mt.Tiers[GPU].Evictions == 0 {
		t.Fatalf("metrics %+v", mt.Tiers[GPU])
	}
	m.check(t)
}

func TestLookupTouchesAreQueuedThenApplied(t *testing.T) {
	m := oneTier(t, GPU, 4, 2)
	var reqs [6][]int32
	for i := range reqs {
		reqs[i] = toks(1, 2, int32(10*i))
	}
	for i := range 4 {
		insertReady(t, m, 0, reqs[i], GPU)
	}
	lookupLen(t, m, 0, reqs[0])
	lookupLen(t, m, 0, reqs[1])
	if n := queuedTouches(m); n != 2 {
		t.Fatalf("%d touches queued after two lookups, want 2", n)
	}
	// LRU order is now 2, 3, 0, 1: the insert applies the touches first.
	insertReady(t, m, 0, reqs[4], GPU)
	if n := queuedTouches(m); n != 0 {
		t.Fatalf("%d touches still queued after a writer", n)
	}
	for i, want := range []int{1, 1, 0, 1, 1} {
		if got := lookupLen(t, m, 0, reqs[i]); got != want {
			t.Fatalf("request %d: %d blocks cached, want %d (the least recently used, 2, evicted)", i, got, want)
		}
	}
}

func TestTouchesDroppedWhenPoliciesBusy(t *testing.T) {
	m := oneTier(t, GPU, 64, 2) // window 0: every lookup touches
	req := toks(32, 2, 0)
	insertReady(t, m, 0, req, GPU)
	lookups := touchBufLen/32 + 1
	var l Lease // one lease: one stripe
	lookup := func() {
		if err := m.Lookup(0, req, &l); err != nil || l.Len() != 32 {
			t.Fatalf("lookup: %d blocks, %v", l.Len(), err)
		}
		m.Release(&l)
	}
	// Policies free: a full queue is applied by the releaser.
	for range lookups {
		lookup()
	}
	if got := m.Metrics().DroppedTouches; got != 0 {
		t.Fatalf("%d touches dropped with the policies free", got)
	}
	// Policies busy (as while another goroutine applies touches): what does
	// not fit in the queue is dropped and counted; nothing else changes.
	m.policyMu.Lock()
	for range lookups {
		lookup()
	}
	queued := queuedTouches(m)
	m.policyMu.Unlock()
	mt := m.Metrics()
	if queued != touchBufLen || mt.DroppedTouches != uint64(lookups*32-touchBufLen) {
		t.Fatalf("%d queued, %d dropped; want %d queued, %d dropped", queued, mt.DroppedTouches, touchBufLen, lookups*32-touchBufLen)
	}
	if mt.HitBlocks != uint64(2*lookups*32) || mt.Tiers[GPU].InUseBlocks != 0 {
		t.Fatalf("metrics %+v", mt)
	}
	m.check(t)
}

func TestRecentBlocksAreNotTouchedAgain(t *testing.T) {
	m := oneTier(t, GPU, 1024, 2) // window 4
	if w := m.tiers[GPU].window; w != 4 {
		t.Fatalf("window %d, want 4", w)
	}
	x := toks(1, 2, 0)
	insertReady(t, m, 0, x, GPU)
	lookupLen(t, m, 0, x)
	if n := queuedTouches(m); n != 0 {
		t.Fatalf("a block inserted 1 operation ago: %d touches queued, want 0", n)
	}
	for i := range 4 {
		insertReady(t, m, 0, toks(1, 2, int32(100+10*i)), GPU)
	}
	lookupLen(t, m, 0, x)
	if n := queuedTouches(m); n != 1 {
		t.Fatalf("a block inserted 5 operations ago: %d touches queued, want 1", n)
	}
	m.Metrics() // applies it
	lookupLen(t, m, 0, x)
	if n := queuedTouches(m); n != 0 {
		t.Fatalf("a block touched 1 operation ago: %d touches queued, want 0", n)
	}
}

func TestMetadataLayout(t *testing.T) {
	if s := unsafe.Sizeof(record{}); s != 64 {
		t.Errorf("record is %d bytes, want 64 (one cache line)", s)
	}
	if s := unsafe.Sizeof(tableEntry{}); s != 16 {
		t.Errorf("table entry is %d bytes, want 16 (four to a cache line)", s)
	}
}

// Lookups on several stripes fill their queues and apply them (or drop
// touches) while the others go on reading: run under -race.
func TestConcurrentLookupsApplyTouches(t *testing.T) {
	m := oneTier(t, GPU, 64, 2) // window 0: every lookup touches
	req := toks(32, 2, 0)
	insertReady(t, m, 0, req, GPU)
	const goroutines, lookups = 4, 100
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var l Lease
			for range lookups {
				if err := m.Lookup(0, req, &l); err != nil || l.Len() != 32 {
					t.Errorf("lookup: %d blocks, %v", l.Len(), err)
					return
				}
				m.Release(&l)
			}
		}()
	}
	wg.Wait()
	mt := m.Metrics()
	if mt.HitBlocks != goroutines*lookups*32 || mt.Tiers[GPU].InUseBlocks != 0 || queuedTouches(m) != 0 {
		t.Fatalf("metrics %+v, %d touches queued", mt, queuedTouches(m))
	}
	t.Logf("%d of %d touches dropped", mt.DroppedTouches, mt.HitBlocks)
	m.check(t)
}

// Lookup probes blocks in batches: the prefix it returns still ends at the
// first block that is missing or differs, wherever that falls in a batch.
func TestLookupStopsAtFirstMissAcrossBatches(t *testing.T) {
	m := oneTier(t, GPU, 128, 2)
	req := toks(40, 2, 0)
	insertReady(t, m, 0, req, GPU)
	if got := lookupLen(t, m, 0, append(req, 7, 7)); got != 40 {
		t.Fatalf("41-block request with 40 cached: %d hits", got)
	}
	for _, miss := range []int{0, 1, 15, 16, 17, 31, 32, 37, 39} {
		other := append([]int32(nil), req...)
		other[2*miss+1] = -1 // block miss differs in its last token
		if got := lookupLen(t, m, 0, other); got != miss {
			t.Errorf("request differing at block %d: %d hits, want %d", miss, got, miss)
		}
	}
	if got := lookupLen(t, m, 1, req); got != 0 {
		t.Errorf("another salt: %d hits", got)
	}
	// Keys only: a key missing from the index in the second batch.
	keys := make([]Key, 0, 40)
	h, err := NewHasher(2)
	if err != nil {
		t.Fatal(err)
	}
	keys = h.AppendKeys(keys, 0, 0, req)
	keys[20] ^= 1
	var l Lease
	if err := m.LookupKeys(0, keys, &l); err != nil || l.Len() != 20 {
		t.Fatalf("keys with block 20 unknown: %d hits, %v", l.Len(), err)
	}
	m.Release(&l)
	m.check(t)
}
