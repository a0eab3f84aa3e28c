package policy

// LRU evicts the least recently used key.
//
// Its state is a queueSlab: one node of plain values per key in a single
// slice, linked by int32 indices, and an index from key to node: a map, or
// for Dense keys (NewDenseLRU) a slice indexed by the key. golang-lru/v2's
// simplelru would do the same job but allocates a list element (a pointer) per
// key; with tens of millions of resident blocks those pointers make every
// garbage collection cycle walk the whole cache, which is what the slab
// avoids. simplelru also evicts only its oldest entry, while Evict here must
// skip keys that are in use.
//
// LRU has no locking inside; the caller serialises every call.
type LRU[K comparable] struct {
	s      queueSlab[K]
	checks sampler
}

var _ Policy[uint64] = (*LRU[uint64])(nil)

// NewLRU returns an empty LRU with room for capacity keys before its slab
// grows. capacity is a hint, not a limit: the caller decides when to Evict.
func NewLRU[K comparable](capacity int) (*LRU[K], error) {
	return newLRU("NewLRU", capacity, func(n int) keyIndex[K] { return make(mapIndex[K], n) })
}

// NewDenseLRU returns an empty LRU for Dense keys, such as the block
// manager's BlockRef: its index from key to node is a slice indexed by the
// key instead of a map, a load instead of a hash and probe on every call,
// and 4 bytes per key up to the largest key instead of about 36 per tracked
// key. Keys MUST be small and dense (see Dense). A key that is removed or
// evicted and then inserted again is a new key.
func NewDenseLRU[K Dense](capacity int) (*LRU[K], error) {
	return newLRU("NewDenseLRU", capacity, func(n int) keyIndex[K] { return newDenseIndex[K](n) })
}

func newLRU[K comparable](constructor string, capacity int, index func(capacity int) keyIndex[K]) (*LRU[K], error) {
	if capacity <= 0 || capacity >= maxNodes-1 {
		return nil, argError(constructor, "capacity", capacity, "1 to 2^31-2 keys")
	}
	return &LRU[K]{s: newQueueSlab(1, capacity, index(capacity))}, nil
}

// Insert tracks key as the most recently used. Inserting a tracked key
// touches it. meta is ignored.
func (p *LRU[K]) Insert(key K, _ Meta) {
	if i, ok := p.s.lookup(key); ok {
		p.s.moveToFront(0, i)
	} else {
		p.s.add(0, key)
	}
	p.check()
}

// Touch makes a tracked key the most recently used.
func (p *LRU[K]) Touch(key K) {
	if i, ok := p.s.lookup(key); ok {
		p.s.moveToFront(0, i)
		p.check()
	}
}

// Remove forgets key.
func (p *LRU[K]) Remove(key K) {
	if i, ok := p.s.lookup(key); ok {
		p.s.del(i)
		p.check()
	}
}

// Evict removes and returns the least recently used key for which evictable
// returns true; a nil evictable accepts every key. A key it skips is in use,
// and counts as just used: it moves to the most recent end, as a block that
// a server frees goes to the end of its free queue. So no Evict walks an
// in-use key twice before every key older than it has been evicted or
// walked: with many requests in flight, eviction costs one step per victim
// plus one per key that came into use since, not a walk of every pinned key
// each time. When no key is evictable (ok false) the walk visits each key
// once and leaves their order as it was.
func (p *LRU[K]) Evict(evictable func(K) bool) (victim K, ok bool) {
	i := p.s.back(0)
	for range p.s.lens[0] {
		key, prev := p.s.nodes[i].key, p.s.nodes[i].prev
		if evictable == nil || evictable(key) {
			p.s.del(i)
			p.check()
			return key, true
		}
		p.s.moveToFront(0, i)
		i = prev
	}
	return victim, false
}

// Len is the number of tracked keys.
func (p *LRU[K]) Len() int { return p.s.lens[0] }

// Contains reports whether key is tracked, without touching it.
func (p *LRU[K]) Contains(key K) bool {
	_, ok := p.s.lookup(key)
	return ok
}

func (p *LRU[K]) check() {
	if p.checks.due(p.Len()) {
		p.s.check()
	}
}
