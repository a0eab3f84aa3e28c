package kvtier

// blockState is a block's state in one tier.
type blockState uint8

const (
	stateNone     blockState = iota // not in the tier
	stateWriting                    // a slot is reserved and a copy or prefill writes it
	stateReady                      // readable (invariant 2)
	stateEvicting                   // being demoted: a copy reads the slot, lookups skip it
)

func (s blockState) String() string {
	return [...]string{"none", "writing", "ready", "evicting"}[s]
}

const (
	flagTokens  uint8 = 1 << iota // the token arena holds the block's tokens
	flagInvalid                   // invalidated: no lookup or insert finds it; freed at its last reference
	flagPinned                    // pinned (Pin): evicted after every unpinned block of its tier
)

// record is one block's metadata: plain values only, so that tens of
// millions of them are a few flat arrays the garbage collector skips. It is
// 64 bytes and the slab's chunks are page-aligned, so a lookup reads one
// cache line per block (plus its tokens, 64 bytes for 16-token blocks).
type record struct {
	key     Key
	parent  Key
	salt    Salt
	slot    [NumTiers]Slot
	refs    uint32           // leases and transfers using the block
	depth   uint32           // position in its request: block i covers tokens [i*B, (i+1)*B)
	touched [NumTiers]uint32 // the tier's tick at its last policy insert or touch
	state   [NumTiers]blockState
	flags   uint8
	// xfers of refs are transfers, and copying[t] the transfers that read
	// or write the block's slot in tier t. A lease pins the block in every
	// tier; a copy pins only the two slots it moves between, so that a
	// block written on from the host tier to NVMe can leave the GPU.
	copying [NumTiers]uint8
	xfers   uint8
}

// evictableIn reports whether tier t may evict the block: ready there, no
// lease holds it, and no copy reads or writes its slot there.
func (r *record) evictableIn(t Tier) bool {
	return r.state[t] == stateReady && r.refs == uint32(r.xfers) && r.copying[t] == 0
}

func (r *record) best() Tier {
	for t := range NumTiers {
		if r.state[t] == stateReady {
			return t
		}
	}
	return NumTiers
}

// is reports whether r is block depth of a request with salt whose
// previous block is parent (Manager.verify's check of the record alone).
func (r *record) is(salt Salt, parent Key, depth int) bool {
	return r.salt == salt && r.parent == parent && r.depth == uint32(depth)
}

// readyTiers is the set of tiers where r is ready, bit t for tier t: its
// lowest bit is best's tier.
func (r *record) readyTiers() uint8 {
	var m uint8
	for t := range NumTiers {
		if r.state[t] == stateReady {
			m |= 1 << t
		}
	}
	return m
}

func (r *record) resident() bool {
	for _, s := range r.state {
		if s != stateNone {
			return true
		}
	}
	return false
}

const (
	slabChunkBits = 14
	slabChunk     = 1 << slabChunkBits
)

// slab holds records in fixed chunks, so growth never copies them and a
// *record stays valid while the manager's lock is held. Block i's tokens
// live at the same index in the token arena, whose chunks are allocated only
// when a block with tokens lands in them (keys-only callers pay nothing).
type slab struct {
	recs        [][]record
	tokens      [][]int32
	blockTokens int
	n           uint32     // records ever allocated
	free        []BlockRef // freed records, reused first
}

func (s *slab) at(i BlockRef) *record {
	return &s.recs[i>>slabChunkBits][i&(slabChunk-1)]
}

// alloc returns a zeroed record's index.
func (s *slab) alloc() BlockRef {
	if n := len(s.free); n > 0 {
		i := s.free[n-1]
		s.free = s.free[:n-1]
		*s.at(i) = record{}
		return i
	}
	i := BlockRef(s.n)
	if int(i>>slabChunkBits) == len(s.recs) {
		s.recs = append(s.recs, make([]record, slabChunk))
		s.tokens = append(s.tokens, nil)
	}
	s.n++
	return i
}

func (s *slab) release(i BlockRef) {
	s.free = append(s.free, i)
}

// tokensOf is block i's token storage, allocating its chunk if needed.
func (s *slab) tokensOf(i BlockRef) []int32 {
	c := &s.tokens[i>>slabChunkBits]
	if *c == nil {
		*c = make([]int32, slabChunk*s.blockTokens)
	}
	off := int(i&(slabChunk-1)) * s.blockTokens
	return (*c)[off : off+s.blockTokens : off+s.blockTokens]
}

// live is the number of records in use.
func (s *slab) live() int { return int(s.n) - len(s.free) }
