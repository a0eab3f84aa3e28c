package kvtier

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// adoptRig is a manager with GPU, host and an NVMe tier of 16 slots, blocks
// of 2 tokens, and a fake mover.
func adoptRig(t *testing.T) (*Manager, *fakeMover) {
	t.Helper()
	fm := newFakeMover()
	var cfg Config
	cfg.BlockTokens = 2
	cfg.Mover = fm
	cfg.Tiers[GPU] = tierCfg(t, 4)
	cfg.Tiers[Host] = tierCfg(t, 4)
	cfg.Tiers[NVMe] = tierCfg(t, 16)
	return mustNew(t, cfg), fm
}

// chain returns the residents of a request's blocks as Insert would have
// made them, in NVMe slots slots[i].
func chain(salt Salt, tokens []int32, slots ...Slot) []Resident {
	keys, _ := appendKeys(nil, nil, 2, salt, 0, tokens)
	out := make([]Resident, len(keys))
	parent := Key(0)
	for i, k := range keys {
		out[i] = Resident{Slot: slots[i], Key: k, Parent: parent, Salt: salt, Position: i, Tokens: slices.Clone(tokens[2*i : 2*i+2])}
		parent = k
	}
	return out
}

func TestAdoptFindsAChain(t *testing.T) {
	m, _ := adoptRig(t)
	tokens := []int32{1, 2, 3, 4, 5, 6}
	// Children before parents, slots out of order: Adopt orders them.
	res := chain(7, tokens, 9, 2, 5)
	slices.Reverse(res)
	n, err := m.Adopt(NVMe, res)
	if err != nil || n != 3 {
		t.Fatalf("Adopt = %d, %v; want 3, nil", n, err)
	}
	m.check(t)
	var l Lease
	if err := m.Lookup(7, tokens, &l); err != nil {
		t.Fatal(err)
	}
	if l.Len() != 3 {
		t.Fatalf("lookup found %d blocks, want 3", l.Len())
	}
	for i, want := range []Slot{9, 2, 5} {
		if b := l.Blocks[i]; b.Tier != NVMe || b.Slot != want {
			t.Errorf("block %d: %v slot %d, want nvme slot %d", i, b.Tier, b.Slot, want)
		}
	}
	m.Release(&l)
	if got := m.Metrics().Tiers[NVMe].ResidentBlocks; got != 3 {
		t.Errorf("nvme resident blocks = %d, want 3", got)
	}
	// Another salt never hits the adopted blocks.
	if err := m.Lookup(8, tokens, &l); err != nil || l.Len() != 0 {
		t.Errorf("lookup with another salt: %d blocks, %v", l.Len(), err)
	}
	m.Release(&l)
}

func TestAdoptSkipsWhatContradictsItself(t *testing.T) {
	m, _ := adoptRig(t)
	good := chain(1, []int32{1, 2, 3, 4}, 0, 1)
	orphan := chain(1, []int32{10, 11, 12, 13}, 2, 3)[1:] // its parent is not on the drive
	otherSalt := chain(1, []int32{20, 21, 22, 23}, 4, 5)
	otherSalt[1].Salt = 2                       // child's salt differs from its parent's
	shortTok := chain(1, []int32{30, 31}, 6)[0] // tokens of the wrong length
	shortTok.Tokens = shortTok.Tokens[:1]       //
	dup := good[0]                              // the same key again, in another slot
	dup.Slot = 7                                //
	cyc := []Resident{{Slot: 8, Key: 100, Parent: 101, Salt: 1, Position: 1}, {Slot: 9, Key: 101, Parent: 100, Salt: 1, Position: 1}}
	below := chain(1, []int32{10, 11, 12, 13, 14, 15}, 10, 11, 12)[2] // below the orphan
	wrongPos := chain(1, []int32{40, 41, 42, 43}, 13, 14)
	wrongPos[1].Position = 3                    // its parent is at 0
	rootPos := chain(1, []int32{50, 51}, 15)[0] // a first block not at 0
	rootPos.Position = 2                        //
	var all []Resident
	all = append(all, good...)
	all = append(all, orphan...)
	all = append(all, otherSalt...)
	all = append(all, shortTok, dup)
	all = append(all, cyc...)
	all = append(all, below)
	all = append(all, wrongPos...)
	all = append(all, rootPos)
	n, err := m.Adopt(NVMe, all)
	if err != nil {
		t.Fatal(err)
	}
	// good (2), the orphan and the block below it, otherSalt's and
	// wrongPos's first blocks.
	if n != 6 {
		t.Fatalf("adopted %d blocks, want 6", n)
	}
	m.check(t)
	// The skipped blocks' slots are free: the tier fills up to capacity
	// with no slot handed out twice.
	var l Lease
	for i := range int32(10) {
		if err := m.Insert(3, []int32{1000 + 2*i, 1001 + 2*i}, NVMe, &l); err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
		if err := m.Commit(&l, nil); err != nil {
			t.Fatal(err)
		}
		m.Release(&l)
	}
	if got := m.Metrics().Tiers[NVMe].ResidentBlocks; got != 16 {
		t.Errorf("nvme resident blocks = %d, want 16 (all slots)", got)
	}
	m.check(t)
}

// TestAdoptOrphanFoundOnceItsPrefixIsBack: blocks whose first block did
// not survive are found as soon as it is inserted again.
func TestAdoptOrphanFoundOnceItsPrefixIsBack(t *testing.T) {
	m, _ := adoptRig(t)
	tokens := []int32{1, 2, 3, 4, 5, 6}
	if n, err := m.Adopt(NVMe, chain(4, tokens, 0, 1, 2)[1:]); err != nil || n != 2 {
		t.Fatalf("Adopt = %d, %v; want 2, nil", n, err)
	}
	var l Lease
	if err := m.Lookup(4, tokens, &l); err != nil || l.Len() != 0 {
		t.Fatalf("lookup without the first block: %d blocks, %v; want 0", l.Len(), err)
	}
	m.Release(&l)
	if err := m.Insert(4, tokens[:2], GPU, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(&l, nil); err != nil {
		t.Fatal(err)
	}
	m.Release(&l)
	if err := m.Lookup(4, tokens, &l); err != nil || l.Len() != 3 {
		t.Fatalf("lookup once the first block is back: %d blocks, %v; want 3", l.Len(), err)
	}
	if l.Blocks[0].Tier != GPU || l.Blocks[1].Tier != NVMe || l.Blocks[2].Tier != NVMe {
		t.Errorf("tiers %v %v %v, want gpu nvme nvme", l.Blocks[0].Tier, l.Blocks[1].Tier, l.Blocks[2].Tier)
	}
	m.Release(&l)
	m.check(t)
}

func TestAdoptKeysOnly(t *testing.T) {
	m, _ := adoptRig(t)
	tokens := []int32{1, 2, 3, 4}
	res := chain(5, tokens, 3, 4)
	for i := range res {
		res[i].Tokens = nil
	}
	if n, err := m.Adopt(NVMe, res); err != nil || n != 2 {
		t.Fatalf("Adopt = %d, %v; want 2, nil", n, err)
	}
	var l Lease
	// Without tokens a token lookup cannot confirm a hit (invariant 1).
	if err := m.Lookup(5, tokens, &l); err != nil || l.Len() != 0 {
		t.Errorf("token lookup of blocks adopted without tokens: %d blocks, %v; want 0", l.Len(), err)
	}
	m.Release(&l)
	keys, _ := appendKeys(nil, nil, 2, 5, 0, tokens)
	if err := m.LookupKeys(5, keys, &l); err != nil || l.Len() != 2 {
		t.Errorf("key lookup: %d blocks, %v; want 2", l.Len(), err)
	}
	m.Release(&l)
}

// TestAdoptEvictsDeepBlocksFirst: the LRU sees a prefix's deepest blocks as
// the oldest, so room is made by evicting from the end of prefixes.
func TestAdoptEvictsDeepBlocksFirst(t *testing.T) {
	m, _ := adoptRig(t)
	var tokens []int32
	var slots []Slot
	for i := range int32(16) {
		tokens = append(tokens, 2*i, 2*i+1)
		slots = append(slots, Slot(i))
	}
	if n, err := m.Adopt(NVMe, chain(1, tokens, slots...)); err != nil || n != 16 {
		t.Fatalf("Adopt = %d, %v; want 16, nil", n, err)
	}
	var l Lease
	if err := m.Insert(2, []int32{99, 99}, NVMe, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(&l, nil); err != nil {
		t.Fatal(err)
	}
	m.Release(&l)
	if err := m.Lookup(1, tokens, &l); err != nil {
		t.Fatal(err)
	}
	if l.Len() != 15 {
		t.Errorf("after one eviction the prefix keeps %d blocks, want 15 (its last evicted)", l.Len())
	}
	m.Release(&l)
}

func TestAdoptBadInputChangesNothing(t *testing.T) {
	m, _ := adoptRig(t)
	ok := chain(1, []int32{1, 2, 3, 4}, 0, 1)
	twice := chain(1, []int32{1, 2, 3, 4}, 3, 3)
	outside := chain(1, []int32{1, 2}, 16)
	for _, tc := range []struct {
		name   string
		tier   Tier
		blocks []Resident
		want   string
	}{
		{"slot outside the tier", NVMe, append(slices.Clone(ok), outside...), "block 2 (key"},
		{"a slot given twice", NVMe, twice, "blocks 0 and 1 both in nvme slot 3"},
		{"unknown tier", NumTiers, ok, "not configured"},
	} {
		n, err := m.Adopt(tc.tier, tc.blocks)
		if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), tc.want) || n != 0 {
			t.Errorf("%s: Adopt = %d, %v; want 0 and ErrBadInput naming %q", tc.name, n, err, tc.want)
		}
	}
	if got := m.Metrics().Tiers[NVMe].ResidentBlocks; got != 0 {
		t.Fatalf("rejected Adopts left %d blocks", got)
	}
	m.check(t)
	// A tier that has handed out slots cannot adopt.
	var l Lease
	if err := m.Insert(1, []int32{7, 7}, NVMe, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(&l, nil); err != nil {
		t.Fatal(err)
	}
	m.Release(&l)
	if n, err := m.Adopt(NVMe, ok); !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "already handed out") || n != 0 {
		t.Errorf("Adopt into a used tier = %d, %v", n, err)
	}
	if got := m.Metrics().Tiers[NVMe].ResidentBlocks; got != 1 {
		t.Errorf("nvme resident blocks = %d, want 1", got)
	}
}

// TestAdoptJoinsKnownBlocks: a block the manager already holds in another
// tier gets its NVMe copy; one that disagrees with it is skipped, and so are
// the blocks below it.
func TestAdoptJoinsKnownBlocks(t *testing.T) {
	tokens := []int32{1, 2, 3, 4}
	for _, disagree := range []bool{false, true} {
		m, _ := adoptRig(t)
		var l Lease
		if err := m.Insert(1, tokens[:2], Host, &l); err != nil {
			t.Fatal(err)
		}
		if err := m.Commit(&l, nil); err != nil {
			t.Fatal(err)
		}
		m.Release(&l)
		res := chain(1, tokens, 6, 7)
		want := 2
		if disagree {
			res[0].Tokens = []int32{1, 3} // the known block's key, other tokens
			want = 0
		}
		if n, err := m.Adopt(NVMe, res); err != nil || n != want {
			t.Fatalf("disagree=%v: Adopt = %d, %v; want %d, nil", disagree, n, err, want)
		}
		m.check(t)
		if err := m.Lookup(1, tokens, &l); err != nil || l.Len() != 1+want/2 {
			t.Fatalf("disagree=%v: lookup: %d blocks, %v", disagree, l.Len(), err)
		}
		if l.Blocks[0].Tier != Host || !disagree && l.Blocks[1].Tier != NVMe {
			t.Errorf("disagree=%v: blocks %+v; want host (the fastest) then nvme", disagree, l.Blocks)
		}
		m.Release(&l)
		if got := m.Metrics().Tiers[NVMe].ResidentBlocks; got != int64(want) {
			t.Errorf("disagree=%v: nvme resident blocks = %d, want %d", disagree, got, want)
		}
	}
}
