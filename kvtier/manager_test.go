package kvtier

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zeebo/xxh3"

	"kvtier.dev/internal/invariants"
)

func oneTier(t testing.TB, tier Tier, slots, bt int) *Manager {
	var cfg Config
	cfg.BlockTokens = bt
	cfg.Tiers[tier] = tierCfg(t, slots)
	return mustNew(t, cfg)
}

// insertReady inserts tokens into tier, commits and releases.
func insertReady(t testing.TB, m *Manager, salt Salt, tokens []int32, tier Tier) int {
	t.Helper()
	var l Lease
	err := m.Insert(salt, tokens, tier, &l)
	n := l.Len()
	if cerr := m.Commit(&l, nil); cerr != nil {
		t.Fatal(cerr)
	}
	m.Release(&l)
	if err != nil && !errors.Is(err, ErrNoSpace) {
		t.Fatal(err)
	}
	return n
}

func lookupLen(t testing.TB, m *Manager, salt Salt, tokens []int32) int {
	t.Helper()
	var l Lease
	if err := m.Lookup(salt, tokens, &l); err != nil {
		t.Fatal(err)
	}
	n := l.Len()
	m.Release(&l)
	return n
}

func TestHasherChainsAndIgnoresPartialBlocks(t *testing.T) {
	h, err := NewHasher(4)
	if err != nil {
		t.Fatal(err)
	}
	a := toks(3, 4, 0)
	k := h.AppendKeys(nil, 7, 0, append(a, 99, 98)) // a partial block
	if len(k) != 3 {
		t.Fatalf("%d keys for 3 full blocks and a partial one", len(k))
	}
	k1 := h.AppendKeys(nil, 7, 0, a[:4])
	k2 := h.AppendKeys(nil, 7, k1[0], a[4:])
	if k1[0] != k[0] || k2[0] != k[1] || k2[1] != k[2] {
		t.Fatalf("chaining from a parent differs: %x %x vs %x", k1, k2, k)
	}
	b := append([]int32(nil), a...)
	b[1]++
	if kb := h.AppendKeys(nil, 7, 0, b); kb[0] == k[0] || kb[2] == k[2] {
		t.Fatal("changing a token of block 0 did not change every key")
	}
	if ks := h.AppendKeys(nil, 8, 0, a); ks[0] == k[0] {
		t.Fatal("salt does not change the key")
	}
	if allocs := testing.AllocsPerRun(100, func() { k = h.AppendKeys(k[:0], 7, 0, a) }); allocs != 0 {
		t.Fatalf("AppendKeys allocates %v times", allocs)
	}
}

func TestInsertLookupPrefix(t *testing.T) {
	m := oneTier(t, Host, 16, 4)
	a := toks(4, 4, 0)
	if n := insertReady(t, m, 1, append(a, 1, 2), Host); n != 4 {
		t.Fatalf("inserted %d blocks, want 4", n)
	}
	if n := lookupLen(t, m, 1, a); n != 4 {
		t.Fatalf("lookup of the same tokens: %d blocks", n)
	}
	if n := lookupLen(t, m, 1, a[:10]); n != 2 {
		t.Fatalf("lookup of 2.5 blocks: %d", n)
	}
	b := append([]int32(nil), a...)
	b[9] = -1 // block 2 differs: only blocks 0 and 1 are shared
	if n := lookupLen(t, m, 1, b); n != 2 {
		t.Fatalf("lookup diverging at block 2: %d", n)
	}
	if n := lookupLen(t, m, 2, a); n != 0 {
		t.Fatalf("another salt hit %d blocks", n)
	}
	var l Lease
	if err := m.Lookup(1, a, &l); err != nil {
		t.Fatal(err)
	}
	for i, b := range l.Blocks {
		if b.Tier != Host || b.Write {
			t.Fatalf("block %d: %+v", i, b)
		}
	}
	if allocs := testing.AllocsPerRun(100, func() {
		if invariants.Enabled {
			return // the invariant walk allocates
		}
		m.Release(&l)
		if err := m.Lookup(1, a, &l); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("Lookup allocates %v times", allocs)
	}
	m.Release(&l)
	mt := m.Metrics()
	if mt.Tiers[Host].ResidentBlocks != 4 || mt.Tiers[Host].InUseBlocks != 0 || mt.Records != 4 {
		t.Fatalf("metrics %+v", mt.Tiers[Host])
	}
	m.check(t)
}

func TestCollisionIsAMiss(t *testing.T) {
	m := oneTier(t, Host, 16, 4)
	h, _ := NewHasher(4)
	a, b := toks(2, 4, 0), toks(2, 4, 100)
	ka, kb := h.AppendKeys(nil, 1, 0, a), h.AppendKeys(nil, 1, 0, b)
	m.testKeyHook = func(k Key) Key {
		if k == kb[0] {
			return ka[0] // b's first block now has a's key
		}
		return k
	}
	insertReady(t, m, 1, a, Host)
	if n := lookupLen(t, m, 1, b); n != 0 {
		t.Fatalf("colliding tokens hit %d blocks", n)
	}
	if got := m.Metrics().Mismatches; got != 1 {
		t.Fatalf("Mismatches = %d, want 1", got)
	}
	if n := insertReady(t, m, 1, b, Host); n != 0 {
		t.Fatalf("insert of colliding tokens stored %d blocks", n)
	}
	if n := lookupLen(t, m, 1, a); n != 2 {
		t.Fatalf("the original blocks after a colliding insert: %d hits", n)
	}
	// Keys alone: same key, another salt or another parent never hits.
	var l Lease
	if err := m.LookupKeys(2, ka, &l); err != nil || l.Len() != 0 {
		t.Fatalf("another salt by keys: %d hits, %v", l.Len(), err)
	}
	m.Release(&l)
	if err := m.LookupKeys(1, []Key{ka[1]}, &l); err != nil || l.Len() != 0 {
		t.Fatalf("block 1's key at position 0: %d hits, %v", l.Len(), err)
	}
	m.Release(&l)
	if err := m.LookupKeys(1, ka, &l); err != nil || l.Len() != 2 {
		t.Fatalf("keys of a: %d hits, %v", l.Len(), err)
	}
	m.Release(&l)
	m.check(t)
}

func TestEvictionSkipsBlocksInUse(t *testing.T) {
	m := oneTier(t, GPU, 4, 2)
	reqs := make([][]int32, 6)
	for i := range reqs {
		reqs[i] = toks(1, 2, int32(10*i))
	}
	for i := range 4 {
		insertReady(t, m, 0, reqs[i], GPU)
	}
	var held Lease
	if err := m.Lookup(0, reqs[0], &held); err != nil || held.Len() != 1 {
		t.Fatal("lookup of request 0", err)
	}
	// Touching 1 makes 2 the least recently used among the evictable.
	lookupLen(t, m, 0, reqs[1])
	insertReady(t, m, 0, reqs[4], GPU)
	if lookupLen(t, m, 0, reqs[0]) != 1 || lookupLen(t, m, 0, reqs[2]) != 0 {
		t.Fatal("evicted a block in use, or not the least recently used")
	}
	// Everything in use: no space.
	var ls [4]Lease
	for i, r := range [][]int32{reqs[1], reqs[3], reqs[4]} {
		if err := m.Lookup(0, r, &ls[i]); err != nil || ls[i].Len() != 1 {
			t.Fatalf("lookup %d: %v", i, err)
		}
	}
	err := m.Insert(0, reqs[5], GPU, &ls[3])
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "gpu") {
		t.Fatalf("insert into a tier all in use: %v", err)
	}
	m.Release(&ls[3])
	if got := m.Metrics().Tiers[GPU].InUseBlocks; got != 4 {
		t.Fatalf("InUseBlocks = %d, want 4", got)
	}
	for i := range 3 {
		m.Release(&ls[i])
	}
	m.Release(&held)
	if n := insertReady(t, m, 0, reqs[5], GPU); n != 1 {
		t.Fatal("insert after release failed")
	}
	mt := m.Metrics().Tiers[GPU]
	if mt.ResidentBlocks != 4 || mt.Evictions != 2 || mt.InUseBlocks != 0 {
		t.Fatalf("metrics %+v", mt)
	}
	m.check(t)
}

func TestCommitErrorAndReleaseWithoutCommitForget(t *testing.T) {
	m := oneTier(t, Host, 4, 2)
	var l Lease
	if err := m.Insert(0, toks(2, 2, 0), Host, &l); err != nil {
		t.Fatal(err)
	}
	if n := lookupLen(t, m, 0, toks(2, 2, 0)); n != 0 {
		t.Fatalf("blocks being written are readable: %d hits", n)
	}
	if err := m.Commit(&l, errors.New("prefill failed")); err != nil {
		t.Fatal(err)
	}
	m.Release(&l)
	if err := m.Insert(0, toks(2, 2, 0), Host, &l); err != nil {
		t.Fatal(err)
	}
	m.Release(&l) // no commit
	if mt := m.Metrics(); mt.Records != 0 || mt.Tiers[Host].ResidentBlocks != 0 {
		t.Fatalf("after abandoned writes: %+v", mt)
	}
	m.check(t)
}

func twoTier(t testing.TB, gpu, host int, writeThrough bool) (*Manager, *fakeMover) {
	f := newFakeMover()
	cfg := Config{BlockTokens: 2, Mover: f, WriteThrough: writeThrough}
	cfg.Tiers[GPU] = tierCfg(t, gpu)
	cfg.Tiers[Host] = tierCfg(t, host)
	return mustNew(t, cfg), f
}

func TestOnboardReadableOnlyAfterCompletion(t *testing.T) {
	m, f := twoTier(t, 2, 8, false)
	a := toks(3, 2, 0)
	insertReady(t, m, 0, a, Host)
	var l Lease
	if err := m.Lookup(0, a, &l); err != nil || l.Len() != 3 {
		t.Fatal("lookup", err)
	}
	m.Plan(&l)
	for _, b := range l.Blocks {
		if b.Action != Load || b.Tier != Host {
			t.Fatalf("plan: %+v", b)
		}
	}
	if err := m.Onboard(&l); err != nil {
		t.Fatal(err)
	}
	// Two GPU slots: block 2 must be recomputed.
	if !l.Blocks[0].Loading || !l.Blocks[1].Loading || l.Blocks[2].Action != Recompute {
		t.Fatalf("onboard: %+v", l.Blocks)
	}
	var l2 Lease
	if err := m.Lookup(0, a, &l2); err != nil || l2.Blocks[0].Tier != Host {
		t.Fatalf("a block being loaded is served from the gpu: %+v", l2.Blocks)
	}
	m.Release(&l2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Wait(ctx, &l); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with copies pending and a cancelled context: %v", err)
	}
	f.completeOne(rand.New(rand.NewPCG(1, 2)), false)
	f.completeOne(rand.New(rand.NewPCG(1, 2)), false)
	if err := m.Wait(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Lookup(0, a, &l2); err != nil || l2.Blocks[0].Tier != GPU || l2.Blocks[1].Tier != GPU || l2.Blocks[2].Tier != Host {
		t.Fatalf("after onboard: %+v", l2.Blocks)
	}
	if f.data[GPU][l2.Blocks[1].Slot] != f.data[Host][l.Blocks[1].Slot] {
		t.Fatal("gpu slot does not hold what was copied")
	}
	m.Release(&l2)
	m.Release(&l)
	mt := m.Metrics()
	if mt.Tiers[GPU].BytesIn != 2<<10 || mt.Tiers[Host].BytesOut != 2<<10 || mt.Tiers[GPU].Hits != 2 {
		t.Fatalf("metrics %+v", mt.Tiers)
	}
	m.check(t)
}

func TestFailedCopyIsReportedAndFreesTheSlot(t *testing.T) {
	m, f := twoTier(t, 2, 8, false)
	a := toks(1, 2, 0)
	insertReady(t, m, 5, a, Host)
	var l Lease
	if err := m.Lookup(5, a, &l); err != nil {
		t.Fatal(err)
	}
	m.Plan(&l)
	if err := m.Onboard(&l); err != nil {
		t.Fatal(err)
	}
	f.completeOne(rand.New(rand.NewPCG(1, 2)), true)
	err := m.Wait(context.Background(), &l)
	if !errors.Is(err, ErrMove) || !errors.Is(err, errMoveTest) || !strings.Contains(err.Error(), "from host slot") {
		t.Fatalf("Wait after a failed copy: %v", err)
	}
	m.Release(&l)
	mt := m.Metrics()
	if mt.Tiers[GPU].ResidentBlocks != 0 || mt.Tiers[Host].ResidentBlocks != 1 || mt.MoveFailures != 1 {
		t.Fatalf("after failure: %+v", mt)
	}
	// Submit failing fails every op.
	f.submitErr = errors.New("queue closed")
	if err := m.Lookup(5, a, &l); err != nil {
		t.Fatal(err)
	}
	m.Plan(&l)
	if err := m.Onboard(&l); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(context.Background(), &l); !errors.Is(err, ErrMove) || !strings.Contains(err.Error(), "queue closed") {
		t.Fatalf("Wait after Submit failed: %v", err)
	}
	m.Release(&l)
	m.check(t)
}

func TestWriteBackDemotes(t *testing.T) {
	m, f := twoTier(t, 2, 4, false)
	reqs := [][]int32{toks(1, 2, 0), toks(1, 2, 10), toks(1, 2, 20)}
	insertReady(t, m, 0, reqs[0], GPU)
	insertReady(t, m, 0, reqs[1], GPU)
	if n := insertReady(t, m, 0, reqs[2], GPU); n != 0 {
		t.Fatal("a write-back insert into a full tier succeeded before its demotion completed")
	}
	if f.len() != 1 {
		t.Fatalf("%d copies pending, want 1 demotion", f.len())
	}
	if n := lookupLen(t, m, 0, reqs[0]); n != 0 {
		t.Fatal("a block being demoted is readable")
	}
	f.drain()
	if n := insertReady(t, m, 0, reqs[2], GPU); n != 1 {
		t.Fatal("insert after the demotion completed failed")
	}
	var l Lease
	if err := m.Lookup(0, reqs[0], &l); err != nil || l.Len() != 1 || l.Blocks[0].Tier != Host {
		t.Fatalf("demoted block: %+v", l.Blocks)
	}
	m.Release(&l)
	mt := m.Metrics()
	if mt.Tiers[GPU].Demotions != 1 || mt.Tiers[GPU].Evictions != 1 || mt.Tiers[Host].BytesIn != 1<<10 {
		t.Fatalf("metrics %+v", mt.Tiers)
	}
	m.check(t)
}

func TestWriteThroughCopiesOnCommitAndDropsOnEviction(t *testing.T) {
	m, f := twoTier(t, 2, 4, true)
	f.inline = true
	reqs := [][]int32{toks(1, 2, 0), toks(1, 2, 10), toks(1, 2, 20)}
	for _, r := range reqs {
		if n := insertReady(t, m, 0, r, GPU); n != 1 {
			t.Fatal("write-through insert failed")
		}
	}
	mt := m.Metrics()
	if mt.Tiers[Host].ResidentBlocks != 3 || mt.Tiers[GPU].ResidentBlocks != 2 || mt.Tiers[GPU].Demotions != 0 {
		t.Fatalf("write-through: %+v", mt.Tiers)
	}
	var l Lease
	if err := m.Lookup(0, reqs[0], &l); err != nil || l.Len() != 1 || l.Blocks[0].Tier != Host {
		t.Fatalf("evicted block: %+v", l.Blocks)
	}
	m.Release(&l)
	m.check(t)
}

func TestOffloadAndAdmission(t *testing.T) {
	f := newFakeMover()
	f.inline = true
	adm := &countAdmitter{seen: map[Key]int{}}
	cfg := Config{BlockTokens: 2, Mover: f}
	cfg.Tiers[Host] = tierCfg(t, 4)
	cfg.Tiers[NVMe] = tierCfg(t, 8)
	cfg.Tiers[NVMe].Admitter = adm
	m := mustNew(t, cfg)
	a := toks(2, 2, 0)
	// A request's lookup records its blocks once; its insert and its
	// retries record nothing more (one record per block per request).
	lookupLen(t, m, 0, a)
	var l Lease
	for range 3 {
		if err := m.Insert(0, a, Host, &l); err != nil {
			t.Fatal(err)
		}
		if err := m.Commit(&l, nil); err != nil {
			t.Fatal(err)
		}
		if err := m.Offload(&l, NVMe); err != nil { // seen once: refused
			t.Fatal(err)
		}
		if l.Len() != 2 || adm.seen[l.Blocks[0].Key] != 1 {
			t.Fatalf("after an insert: %d blocks, seen %d times", l.Len(), adm.seen[l.Blocks[0].Key])
		}
		m.Release(&l)
	}
	if got := m.Metrics().Tiers[NVMe].Refused[NotAdmitted]; got != 6 {
		t.Errorf("%d refusals counted, want 6 (2 blocks, 3 offloads)", got)
	}
	if err := m.Lookup(0, a, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Offload(&l, NVMe); err != nil { // the lookup's own record comes first: admitted
		t.Fatal(err)
	}
	if err := m.Wait(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	m.Release(&l)
	if got := m.Metrics().Tiers[NVMe].ResidentBlocks; got != 2 {
		t.Fatalf("%d blocks in nvme after two sightings, want 2", got)
	}
	if err := m.Offload(&l, GPU); !errors.Is(err, ErrBadInput) {
		t.Fatalf("Offload to an absent tier: %v", err)
	}
	m.check(t)
}

// countAdmitter admits keys recorded at least twice (exact, for tests).
type countAdmitter struct{ seen map[Key]int }

func (c *countAdmitter) Record(k Key)     { c.seen[k]++ }
func (c *countAdmitter) Admit(k Key) bool { return c.seen[k] >= 2 }

func TestMetricsOff(t *testing.T) {
	cfg := Config{BlockTokens: 2, DisableMetrics: true}
	cfg.Tiers[GPU] = tierCfg(t, 2)
	m := mustNew(t, cfg)
	insertReady(t, m, 0, toks(2, 2, 0), GPU)
	lookupLen(t, m, 0, toks(2, 2, 0))
	mt := m.Metrics()
	if mt.Lookups != 0 || mt.Tiers[GPU].ResidentBlocks != 0 || mt.Tiers[GPU].CapacitySlots != 2 {
		t.Fatalf("disabled metrics: %+v", mt)
	}
}

func TestPlanner(t *testing.T) {
	m, _ := twoTier(t, 4, 4, false)
	m.planner = recomputeAfter(1)
	insertReady(t, m, 0, toks(3, 2, 0), Host)
	var l Lease
	if err := m.Lookup(0, toks(4, 2, 0), &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Plan(&l); err != nil {
		t.Fatal(err)
	}
	if l.Blocks[0].Action != Load || l.Blocks[1].Action != Recompute || l.Blocks[2].Action != Recompute {
		t.Fatalf("plan %+v", l.Blocks)
	}
	if got := l.Estimate(); got.Time != 1 {
		t.Errorf("the lease's estimate %+v, want the planner's", got)
	}
	m.planner = failingPlanner{}
	if err := m.Plan(&l); err == nil || !strings.Contains(err.Error(), "no model") || l.Blocks[1].Action != Load {
		t.Fatalf("failing planner: %v, %+v", err, l.Blocks)
	}
	if got := l.Estimate(); got != (Estimate{}) {
		t.Errorf("a failed plan's estimate %+v, want none", got)
	}
	m.Release(&l)
}

// recomputeAfter loads blocks before position n and recomputes the rest.
type recomputeAfter int

func (n recomputeAfter) Plan(req *PlanRequest, actions []Action) (Estimate, error) {
	blocks := req.Blocks
	if len(blocks) != 4 || !blocks[2].Cached || blocks[3].Cached {
		return Estimate{}, fmt.Errorf("planner got %+v, want 3 cached blocks and 1 to compute", blocks)
	}
	for i := range blocks {
		if i < int(n) {
			actions[i] = Load
		} else {
			actions[i] = Recompute
		}
	}
	return Estimate{Time: time.Duration(n)}, nil
}

type failingPlanner struct{}

func (failingPlanner) Plan(*PlanRequest, []Action) (Estimate, error) {
	return Estimate{}, errors.New("no model")
}

// TestKeyEncodingIsLittleEndian pins the key of one block to its definition
// (internal/blockkey) over explicit little-endian bytes, so that the fast
// encoding of little-endian machines matches the portable one.
func TestKeyEncodingIsLittleEndian(t *testing.T) {
	h, _ := NewHasher(2)
	got := h.AppendKeys(nil, 0x0102030405060708, 0x1112131415161718, []int32{0x21222324, -2})
	tok := []byte{0x24, 0x23, 0x22, 0x21, 0xfe, 0xff, 0xff, 0xff}
	pair := []byte{0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.LittleEndian.PutUint64(pair[8:], xxh3.HashSeed(tok, 0x0102030405060708))
	if want := Key(xxh3.Hash(pair)); got[0] != want {
		t.Fatalf("key %#x, want XXH3 of the little-endian encoding %#x", got[0], want)
	}
}

// TestCopyPinsOnlyItsSlots: with write-through to a slow NVMe tier, a
// block whose host-to-NVMe copy is still in flight leaves the GPU when the
// GPU tier needs its slot (the copy reads the host slot, not the GPU's),
// while its host slot stays pinned until that copy completes. Before copies
// pinned only their own slots, any copy held the block in every tier, and
// a server's GPU tier filled with blocks waiting for NVMe writes (Insert
// found no space and the blocks past it were never cached).
func TestCopyPinsOnlyItsSlots(t *testing.T) {
	f := newFakeMover()
	cfg := Config{BlockTokens: 2, Mover: f, WriteThrough: true}
	cfg.Tiers[GPU] = tierCfg(t, 2)
	cfg.Tiers[Host] = tierCfg(t, 2)
	cfg.Tiers[NVMe] = tierCfg(t, 8)
	m := mustNew(t, cfg)
	// completeInto completes the pending copies into tier to, and none
	// other; it returns how many.
	completeInto := func(to Tier) int {
		n := 0
		for {
			f.mu.Lock()
			j := slices.IndexFunc(f.pending, func(p pendingOp) bool { return p.t.Ops[p.i].To == to })
			if j < 0 {
				f.mu.Unlock()
				return n
			}
			p := f.pending[j]
			f.pending = slices.Delete(f.pending, j, j+1)
			f.copy(p)
			f.mu.Unlock()
			p.t.Complete(p.i, nil)
			n++
		}
	}
	a, b, c := toks(2, 2, 0), toks(2, 2, 100), toks(2, 2, 200)
	if n := insertReady(t, m, 0, a, GPU); n != 2 {
		t.Fatalf("a: %d blocks inserted", n)
	}
	if n := completeInto(Host); n != 2 {
		t.Fatalf("a's write-through to the host: %d copies", n)
	}
	if f.len() != 2 {
		t.Fatalf("%d copies pending, want a's two to NVMe", f.len())
	}
	m.check(t)
	// The GPU tier is full of a, whose only copies in flight read the host.
	if n := insertReady(t, m, 0, b, GPU); n != 2 {
		t.Fatalf("b: %d of 2 blocks inserted into a GPU tier whose blocks only wait for host-to-NVMe copies", n)
	}
	if n := completeInto(Host); n != 0 {
		t.Fatalf("b's write-through to the host started %d copies before a's host slots were free, want 0", n)
	}
	m.check(t)
	// a's host slots are read by its NVMe copies: c's write-through to
	// the host finds no slot until they complete.
	if n := insertReady(t, m, 0, c, GPU); n != 2 {
		t.Fatalf("c: %d blocks inserted", n)
	}
	if got := m.Metrics().Tiers[Host].ResidentBlocks; got != 2 {
		t.Fatalf("%d host blocks, want a's 2 (pinned by their NVMe copies)", got)
	}
	f.drain()
	m.check(t)
	if n := lookupLen(t, m, 0, a); n != 2 {
		t.Fatalf("a after its NVMe copies: %d blocks found", n)
	}
}

// TestInsertSetsPosition: Block.Position is the block's index in the
// request after Insert too (the remote tier's fetch fills host slots by it).
func TestInsertSetsPosition(t *testing.T) {
	m := oneTier(t, GPU, 8, 4)
	tokens := toks(5, 4, 0)
	insertReady(t, m, 1, tokens[:3*4], GPU) // blocks 0-2 written
	var w Lease
	if err := m.Insert(1, tokens, GPU, &w); err != nil {
		t.Fatal(err)
	}
	defer m.Release(&w)
	defer m.Commit(&w, errors.New("not written"))
	for i, b := range w.Blocks {
		if b.Position != i || b.Write != (i >= 3) {
			t.Fatalf("block %d: Position %d, Write %v", i, b.Position, b.Write)
		}
	}
}
