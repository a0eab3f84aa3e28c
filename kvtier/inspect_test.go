package kvtier

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"kvtier.dev/internal/invariants"
)

// TestPeekAndRange: Peek and Range report what the manager holds, without
// a lease or a policy touch, and forget invalidated blocks.
func TestPeekAndRange(t *testing.T) {
	m, f := twoTier(t, 4, 8, true)
	f.inline = true
	a := toks(3, 2, 0)
	insertReady(t, m, 5, a, GPU)
	var l Lease
	if err := m.Lookup(5, a, &l); err != nil || l.Len() != 3 {
		t.Fatal(l.Len(), err)
	}
	keys := slices.Clone(l.keys)
	m.Release(&l)
	before := m.Metrics()
	for i, k := range keys {
		b, ok := m.Peek(5, k)
		if !ok || b.Key != k || b.Position != i || b.Salt != 5 || !b.Ready[GPU] || !b.Ready[Host] || b.Held[NVMe] {
			t.Fatalf("block %d: %+v, %v", i, b, ok)
		}
		if i > 0 && b.Parent != keys[i-1] {
			t.Errorf("block %d: parent %#x, want %#x", i, uint64(b.Parent), uint64(keys[i-1]))
		}
	}
	if _, ok := m.Peek(6, keys[0]); ok {
		t.Error("Peek found a block under another salt")
	}
	if after := m.Metrics(); after.Lookups != before.Lookups || after.Tiers[GPU].Hits != before.Tiers[GPU].Hits {
		t.Errorf("Peek counted as a lookup: %+v, before %+v", after, before)
	}
	var seen []Key
	m.Range(func(b BlockInfo) bool { seen = append(seen, b.Key); return true })
	slices.Sort(seen)
	want := slices.Clone(keys)
	slices.Sort(want)
	if !slices.Equal(seen, want) {
		t.Errorf("Range saw %v, want %v", seen, want)
	}
	n := 0
	m.Range(func(BlockInfo) bool { n++; return false })
	if n != 1 {
		t.Errorf("Range went on after fn returned false: %d calls", n)
	}
	if _, err := m.Invalidate(5, a); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Peek(5, keys[0]); ok {
		t.Error("Peek found an invalidated block")
	}
	m.Range(func(b BlockInfo) bool { t.Errorf("Range reported invalidated block %#x", uint64(b.Key)); return true })
	if err := m.Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestSlotBytesAndLeasedKeys(t *testing.T) {
	m, _ := twoTier(t, 4, 8, false)
	if m.SlotBytes(GPU) != 1<<10 || m.SlotBytes(NVMe) != 0 || m.SlotBytes(NumTiers) != 0 {
		t.Errorf("SlotBytes: %d %d %d", m.SlotBytes(GPU), m.SlotBytes(NVMe), m.SlotBytes(NumTiers))
	}
	var l Lease
	if _, ok := m.LeasedKeys(&l); ok {
		t.Error("LeasedKeys of an empty lease")
	}
	a := toks(3, 2, 0)
	if err := m.Lookup(0, a, &l); err != nil {
		t.Fatal(err)
	}
	keys, ok := m.LeasedKeys(&l)
	if !ok || len(keys) != 3 {
		t.Fatalf("LeasedKeys of a 3-block lookup with nothing cached: %v, %v", keys, ok)
	}
	other, _ := twoTier(t, 4, 8, false)
	if _, ok := other.LeasedKeys(&l); ok {
		t.Error("LeasedKeys of another manager's lease")
	}
	m.Release(&l)
	if _, ok := m.LeasedKeys(&l); ok {
		t.Error("LeasedKeys of a released lease")
	}
	if err := m.LookupKeys(0, []Key{7, 8}, &l); err != nil {
		t.Fatal(err)
	}
	if keys, ok := m.LeasedKeys(&l); !ok || !slices.Equal(keys, []Key{7, 8}) {
		t.Errorf("LeasedKeys after LookupKeys: %v %v", keys, ok)
	}
	m.Release(&l)
}

// TestVerifyReportsABrokenInvariant: Verify returns (not panics) the first
// inconsistency, naming it.
func TestVerifyReportsABrokenInvariant(t *testing.T) {
	m := oneTier(t, GPU, 4, 2)
	insertReady(t, m, 0, toks(2, 2, 0), GPU)
	if err := m.Verify(); err != nil {
		t.Fatal(err)
	}
	m.lock()
	m.tiers[GPU].free = append(m.tiers[GPU].free, 0) // slot 0 both held and free
	m.unlock()
	err := m.Verify()
	var b *invariants.Broken
	if !errors.As(err, &b) || !strings.Contains(err.Error(), "slot 0") {
		t.Fatalf("Verify of a slot held and free: %v", err)
	}
}

// recordingPlanner records the request it was asked to plan and loads
// what it can.
type recordingPlanner struct{ got PlanRequest }

func (p *recordingPlanner) Plan(req *PlanRequest, actions []Action) (Estimate, error) {
	p.got = *req
	p.got.Blocks = slices.Clone(req.Blocks)
	return LoadAll{}.Plan(req, actions)
}

// backlogMover reports a fixed backlog.
type backlogMover struct {
	*fakeMover
	b Backlog
}

func (m backlogMover) Backlog() Backlog { return m.b }

// TestPlanSeesTheWholeRequest: the planner gets every block of the prompt
// (a partial last block by its tokens) and the Mover's backlog; LookupKeys
// callers say how many tokens the request has with SetTokens.
func TestPlanSeesTheWholeRequest(t *testing.T) {
	rp := &recordingPlanner{}
	bm := backlogMover{newFakeMover(), Backlog{Ingress: 3 * time.Millisecond, Drive: time.Second, GPU: time.Microsecond}}
	cfg := Config{BlockTokens: 4, Mover: bm, Planner: rp}
	cfg.Tiers[GPU], cfg.Tiers[Host] = tierCfg(t, 8), tierCfg(t, 8)
	m := mustNew(t, cfg)
	prompt := toks(3, 4, 0)[:10] // 2 full blocks and 2 tokens
	insertReady(t, m, 0, prompt[:4], Host)
	var l Lease
	if err := m.Lookup(0, prompt, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Plan(&l); err != nil {
		t.Fatal(err)
	}
	g := rp.got
	if len(g.Blocks) != 3 || !g.Blocks[0].Cached || g.Blocks[1].Cached || g.Blocks[2].Cached || g.LastTokens != 2 || g.Backlog != bm.b {
		t.Errorf("planned %+v, want 3 blocks (the first cached), 2 tokens in the last, the mover's backlog", g)
	}
	m.Release(&l)

	if err := m.LookupKeys(0, []Key{1, 2, 3}, &l); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{8, 0, -1, 1 << 32} {
		if err := l.SetTokens(n); !errors.Is(err, ErrBadInput) {
			t.Errorf("SetTokens(%d) for 3 keys of 4 tokens: %v, want ErrBadInput", n, err)
		}
	}
	if err := l.SetTokens(9); err != nil {
		t.Fatal(err)
	}
	if err := m.Plan(&l); err != nil {
		t.Fatal(err)
	}
	if g := rp.got; len(g.Blocks) != 3 || g.LastTokens != 1 {
		t.Errorf("LookupKeys of 3 keys, 9 tokens: planned %+v, want 3 blocks, 1 token in the last", g)
	}
	if err := l.SetTokens(18); err != nil { // a tail past the keys, computed
		t.Fatal(err)
	}
	if err := m.Plan(&l); err != nil {
		t.Fatal(err)
	}
	if g := rp.got; len(g.Blocks) != 5 || g.Blocks[4].Cached || g.LastTokens != 2 {
		t.Errorf("LookupKeys of 3 keys, 18 tokens: planned %+v, want 5 blocks, 2 tokens in the last", g)
	}
	m.Release(&l)
	if err := l.SetTokens(9); !errors.Is(err, ErrBadInput) {
		t.Errorf("SetTokens on a released lease: %v", err)
	}
}

// TestBatchLease: a Batch names the lease whose call asked for its copies,
// and none for the manager's own.
func TestBatchLease(t *testing.T) {
	m, f := twoTier(t, 4, 8, true)
	a := toks(2, 2, 0)
	var w Lease
	if err := m.Insert(0, a, GPU, &w); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(&w, nil); err != nil { // write-through to the host
		t.Fatal(err)
	}
	f.mu.Lock()
	if len(f.pending) == 0 || f.pending[0].t.Lease() != &w {
		t.Errorf("the write-through batch names lease %p, want the committing one %p", f.pending[0].t.Lease(), &w)
	}
	f.mu.Unlock()
	f.drain()
	m.Release(&w)
}

func TestRecomputeAll(t *testing.T) {
	blocks := []PlanBlock{{Cached: true, Tier: GPU}, {Cached: true, Tier: Host}, {}}
	acts := make([]Action, 3)
	if _, err := (RecomputeAll{}).Plan(&PlanRequest{Blocks: blocks}, acts); err != nil || !slices.Equal(acts, []Action{Use, Recompute, Recompute}) {
		t.Errorf("RecomputeAll: %v, %v", acts, err)
	}
}
