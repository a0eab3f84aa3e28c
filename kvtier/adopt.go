package kvtier

import (
	"fmt"
	"math"
	"slices"
)

// Resident is a block that a tier's storage already holds when the manager
// starts: an NVMe block a previous run left, as DeviceMover.Recovered
// reports it.
type Resident struct {
	// Slot is the manager's slot of the tier that holds the block.
	Slot Slot
	// Key, Parent and Salt identify the block as Insert made them: Parent
	// is the previous block's key, 0 for a prefix's first block.
	Key, Parent Key
	Salt        Salt
	// Position is the block's index in its prefix, 0 for the first.
	Position int
	// Tokens are the block's token ids, BlockTokens of them, or nil where
	// they were not kept: such a block is found by LookupKeys only (a
	// token lookup cannot confirm it, invariant 1).
	Tokens []int32
}

// Adopt makes tier t hold blocks its storage already has, so that a
// restarted server keeps its warm NVMe tier. It is for a tier of which no
// slot has been handed out yet, typically right after New.
//
// Each block is adopted at its Position. A block whose ancestors are not
// among the blocks (they lived in faster tiers, which did not survive) is
// adopted too: a lookup reaches it once they are back, recomputed and
// inserted by the first request that needs them. Skipped are blocks that
// contradict themselves or their parent, and the blocks below them: tokens
// that are not BlockTokens long, a first block (Parent 0) at a position
// other than 0 or the reverse, a parent among the blocks with another salt
// or a position other than one less, a block the manager already knows
// (from another tier) with other metadata, and the second of two blocks
// with one key. Their slots are free. The tier's policy sees the deepest blocks first, so that
// a prefix's first blocks are evicted last. Adopt returns how many blocks it
// adopted.
//
// An absent tier, a tier already in use, a slot outside the tier or a slot
// given twice is an error (ErrBadInput) and adopts nothing.
func (m *Manager) Adopt(t Tier, blocks []Resident) (int, error) {
	if err := m.checkTier("Adopt", t); err != nil {
		return 0, err
	}
	m.lock()
	defer m.unlock()
	ts := &m.tiers[t]
	if ts.next != 0 {
		return 0, fmt.Errorf("%w: Adopt: the %v tier has already handed out slots", ErrBadInput, t)
	}
	used := make([]uint64, (ts.slots+63)/64)
	taken := make(map[Slot]int, len(blocks))
	for i, b := range blocks {
		if uint32(b.Slot) >= ts.slots {
			return 0, fmt.Errorf("%w: Adopt: block %d (key %#x): slot %d outside the %v tier's %d slots", ErrBadInput, i, uint64(b.Key), b.Slot, t, ts.slots)
		}
		if j, dup := taken[b.Slot]; dup {
			return 0, fmt.Errorf("%w: Adopt: blocks %d and %d both in %v slot %d", ErrBadInput, j, i, t, b.Slot)
		}
		taken[b.Slot] = i
	}

	a := adoption{m: m, t: t, blocks: blocks, first: make(map[Key]int, len(blocks)), depth: make([]int32, len(blocks))}
	for i, b := range blocks {
		a.depth[i] = adoptUnknown
		if _, dup := a.first[b.Key]; dup {
			a.depth[i] = adoptSkip
			continue
		}
		a.first[b.Key] = i
	}
	order := make([]int, 0, len(blocks))
	for i := range blocks {
		if a.resolve(i) >= 0 {
			order = append(order, i)
		}
	}
	// Deepest first into the policy: the roots are then the most recent.
	slices.SortFunc(order, func(x, y int) int {
		if d := a.depth[y] - a.depth[x]; d != 0 {
			return int(d)
		}
		return int(blocks[x].Slot) - int(blocks[y].Slot)
	})
	next := uint32(0)
	for _, i := range order {
		b := &blocks[i]
		ref, found := a.known(b.Key)
		if !found {
			ref = m.newRecord(b.Key, b.Parent, b.Salt, int(a.depth[i]), b.Tokens)
		} else if b.Tokens != nil && m.recs.at(ref).flags&flagTokens == 0 {
			r := m.recs.at(ref)
			copy(m.recs.tokensOf(ref), b.Tokens)
			r.flags |= flagTokens
		}
		m.recs.at(ref).slot[t] = b.Slot
		m.setState(ref, t, stateReady)
		m.policyInsert(t, ref)
		used[b.Slot/64] |= 1 << (b.Slot % 64)
		next = max(next, uint32(b.Slot)+1)
	}
	ts.next = next
	for s := next; s > 0; s-- {
		if used[(s-1)/64]&(1<<((s-1)%64)) == 0 {
			ts.free = append(ts.free, Slot(s-1))
		}
	}
	m.checkSampled()
	return len(order), nil
}

// Depths of the blocks being adopted, besides their position (>= 0).
const (
	adoptUnknown  = -3
	adoptVisiting = -2
	adoptSkip     = -1
)

// adoption is the state of one Adopt call.
type adoption struct {
	m      *Manager
	t      Tier
	blocks []Resident
	first  map[Key]int // the first block of each key
	depth  []int32     // position in the chain, or one of the adopt* marks
}

// resolve returns block i's position, or adoptSkip when the block cannot be
// adopted. It checks the block against its parent first.
func (a *adoption) resolve(i int) int32 {
	switch d := a.depth[i]; d {
	case adoptUnknown:
	case adoptVisiting: // a cycle of parents: corrupt metadata
		return adoptSkip
	default:
		return d
	}
	a.depth[i] = adoptVisiting
	d := a.position(i)
	a.depth[i] = d
	return d
}

// position works out block i's position (or adoptSkip) for resolve.
func (a *adoption) position(i int) int32 {
	b := &a.blocks[i]
	switch {
	case b.Tokens != nil && len(b.Tokens) != a.m.blockTokens,
		b.Position < 0 || b.Position > math.MaxInt32,
		(b.Parent == 0) != (b.Position == 0):
		return adoptSkip
	}
	d := int32(b.Position)
	if p, ok := a.first[b.Parent]; ok && b.Parent != 0 {
		// A parent that is skipped may be a collision the manager caught:
		// what was computed after it cannot be trusted either.
		if pd := a.resolve(p); pd < 0 || a.blocks[p].Salt != b.Salt || pd != d-1 {
			return adoptSkip
		}
	}
	if ref, found := a.known(b.Key); found {
		r := a.m.recs.at(ref)
		if !a.m.verify(ref, r, b.Salt, b.Parent, int(d), nil) || r.state[a.t] != stateNone {
			return adoptSkip
		}
		if b.Tokens != nil && r.flags&flagTokens != 0 && !slices.Equal(a.m.recs.tokensOf(ref), b.Tokens) {
			return adoptSkip
		}
	}
	return d
}

// known returns the manager's record of key, if it has one.
func (a *adoption) known(k Key) (BlockRef, bool) {
	idx, found := a.m.index.find(k)
	return BlockRef(idx), found
}
