package kvtier

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Resident is a block that a tier's storage already holds when the manager
// starts, as devmover.Mover.Recovered reports those a previous run left.
type Resident struct {
	// Slot is the block's slot in the tier.
	Slot Slot
	// Key, Parent (0 for a prefix's first block), Salt and Position
	// identify the block as Insert made it.
	Key, Parent Key
	Salt        Salt
	Position    int
	// Tokens are the block's token ids, or nil where they were not kept
	// (then only LookupKeys finds it).
	Tokens []int32
}

// Adopt makes tier t, of which no slot was handed out yet, hold blocks its
// storage already has (a restarted server's NVMe tier) and returns how many.
// A block that contradicts itself, its parent or the manager is skipped with
// the blocks below it; a bad tier or slot adopts nothing (ErrBadInput).
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
	given := newSlotSet(ts.slots)
	for i, b := range blocks {
		if uint32(b.Slot) >= ts.slots {
			return 0, fmt.Errorf("%w: Adopt: block %d (key %#x): slot %d outside the %v tier's %d slots", ErrBadInput, i, uint64(b.Key), b.Slot, t, ts.slots)
		}
		if given.has(b.Slot) {
			j := slices.IndexFunc(blocks, func(o Resident) bool { return o.Slot == b.Slot })
			return 0, fmt.Errorf("%w: Adopt: blocks %d and %d both in %v slot %d", ErrBadInput, j, i, t, b.Slot)
		}
		given.add(b.Slot)
	}

	a := adoption{m: m, t: t, blocks: blocks, depth: make([]int32, len(blocks)), byKey: make([]int32, len(blocks))}
	for i := range blocks {
		a.depth[i] = adoptUnknown
		a.byKey[i] = int32(i)
	}
	// Sorted by key, then by index: the first block of each key leads its
	// run, and the others are skipped.
	slices.SortFunc(a.byKey, func(x, y int32) int {
		if kx, ky := blocks[x].Key, blocks[y].Key; kx != ky {
			return cmp.Compare(kx, ky)
		}
		return cmp.Compare(x, y)
	})
	for j := 1; j < len(a.byKey); j++ {
		if blocks[a.byKey[j]].Key == blocks[a.byKey[j-1]].Key {
			a.depth[a.byKey[j]] = adoptSkip
		}
	}
	order := make([]int, 0, len(blocks))
	for i := range blocks {
		if a.resolve(i) >= 0 {
			order = append(order, i)
		}
	}
	// Deepest first into the policy: the roots are then the most recent.
	slices.SortFunc(order, func(x, y int) int {
		if d := cmp.Compare(a.depth[y], a.depth[x]); d != 0 {
			return d
		}
		return cmp.Compare(blocks[x].Slot, blocks[y].Slot)
	})
	order = m.withinCaps(t, blocks, order)
	used := newSlotSet(ts.slots)
	next := uint32(0)
	for _, i := range order {
		b := &blocks[i]
		ref, found := a.known(b.Salt, b.Key)
		if !found {
			ref = m.newRecord(b.Key, b.Parent, b.Salt, int(a.depth[i]), b.Tokens, m.tokenHashOf(b.Salt, b.Tokens))
		} else if r := m.recs.at(ref); b.Tokens != nil && r.flags&flagTokens == 0 {
			m.addTokens(ref, b.Tokens, m.tokenHashOf(b.Salt, b.Tokens))
		}
		m.recs.at(ref).slot[t] = b.Slot
		m.setState(ref, t, stateReady)
		m.policyInsert(t, ref)
		used.add(b.Slot)
		next = max(next, uint32(b.Slot)+1)
	}
	ts.next = next
	for s := Slot(next); s > 0; s-- {
		if !used.has(s - 1) {
			ts.free = append(ts.free, s-1)
		}
	}
	m.checkSampled()
	return len(order), nil
}

// withinCaps drops from order (deepest first) the deepest blocks of each
// tenant beyond its cap of tier t's slots (Config.Tenants); their slots
// stay free.
func (m *Manager) withinCaps(t Tier, blocks []Resident, order []int) []int {
	if m.ten == nil {
		return order
	}
	held := make([]int64, len(m.ten.groups))
	keep := make([]bool, len(order))
	for j := len(order) - 1; j >= 0; j-- {
		g := m.ten.of(blocks[order[j]].Salt)
		if c := m.ten.groups[g].cap[t]; c == 0 || held[g] < c {
			held[g]++
			keep[j] = true
		}
	}
	n := 0
	for j, i := range order {
		if keep[j] {
			order[n] = i
			n++
		}
	}
	return order[:n]
}

// slotSet is a bitmap of a tier's slots.
type slotSet []uint64

func newSlotSet(slots uint32) slotSet { return make(slotSet, (uint64(slots)+63)/64) }
func (s slotSet) add(x Slot)          { s[x/64] |= 1 << (x % 64) }
func (s slotSet) has(x Slot) bool     { return s[x/64]&(1<<(x%64)) != 0 }

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
	byKey  []int32 // indexes of blocks sorted by key, then index
	depth  []int32 // position in the prefix, or one of the adopt* marks
}

// parent returns the index of the first block whose key is b's parent.
func (a *adoption) parent(b *Resident) (int, bool) {
	j, ok := slices.BinarySearchFunc(a.byKey, b.Parent, func(i int32, k Key) int { return cmp.Compare(a.blocks[i].Key, k) })
	if !ok {
		return 0, false
	}
	return int(a.byKey[j]), true
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
	if p, ok := a.parent(b); ok && b.Parent != 0 {
		// A parent that is skipped may be a collision the manager caught:
		// what was computed after it cannot be trusted either.
		if pd := a.resolve(p); pd < 0 || a.blocks[p].Salt != b.Salt || pd != d-1 {
			return adoptSkip
		}
	}
	if ref, found := a.known(b.Salt, b.Key); found {
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

// known returns the manager's record of key under salt, if it has one.
func (a *adoption) known(s Salt, k Key) (BlockRef, bool) {
	idx, found := a.m.index.find(s, k)
	return BlockRef(idx), found
}
