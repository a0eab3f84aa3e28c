package policy

import "kvtier.dev/internal/invariants"

// keyIndex maps a tracked key to its node in a policy's slab. Every policy
// holds one, chosen by its constructor: a mapIndex for any comparable key
// (NewLRU, NewTwoQ, ...) or a denseIndex for keys that are small dense
// integers (NewDenseLRU, NewDenseTwoQ, ...). The slab and queue code is the
// same for both; only the index differs.
type keyIndex[K comparable] interface {
	// get returns key's node, and false when key is not indexed.
	get(key K) (int32, bool)
	// set indexes key, which MUST NOT be indexed, at node i.
	set(key K, i int32)
	// del forgets key, which MUST be indexed.
	del(key K)
	// len is the number of indexed keys.
	len() int
}

// Dense is the constraint on the keys of the dense policies: small integers
// handed out densely from zero and reused after they are freed, such as
// kvtier.BlockRef, a record's index in the block manager's slab.
type Dense interface{ ~uint32 }

// mapIndex is the index for any comparable key: about 36 bytes per uint64
// key at a million keys, and a hash and probe per call.
type mapIndex[K comparable] map[K]int32

func (m mapIndex[K]) get(key K) (int32, bool) {
	i, ok := m[key]
	return i, ok
}

func (m mapIndex[K]) set(key K, i int32) { m[key] = i }
func (m mapIndex[K]) del(key K)          { delete(m, key) }
func (m mapIndex[K]) len() int           { return len(m) }

// denseIndex is the index for Dense keys: a slice indexed by the key, -1 for
// an absent key, grown on demand to the largest key indexed and never
// shrunk. It costs 4 bytes per key up to the largest key ever indexed, so
// keys MUST be dense: a single key near 2^32 would make it 16 GiB. A lookup
// is one bounds check and one load, and allocates nothing once the slice has
// grown past the largest key.
type denseIndex[K Dense] struct {
	nodes []int32 // by key: the key's node, or -1
	n     int     // indexed keys
}

// newDenseIndex returns an empty denseIndex with room for keys below
// capacity before it grows.
func newDenseIndex[K Dense](capacity int) *denseIndex[K] {
	d := &denseIndex[K]{nodes: make([]int32, capacity)}
	fillAbsent(d.nodes)
	return d
}

func (d *denseIndex[K]) get(key K) (int32, bool) {
	if uint64(key) >= uint64(len(d.nodes)) {
		return -1, false
	}
	i := d.nodes[key]
	return i, i >= 0
}

func (d *denseIndex[K]) set(key K, i int32) {
	if uint64(key) >= uint64(len(d.nodes)) {
		d.grow(key)
	}
	if d.nodes[key] >= 0 { // a branch, not a plain assertf: boxing key would allocate
		invariants.Check(false, "policy: dense key %d indexed twice", uint64(key))
	}
	d.nodes[key] = i
	d.n++
}

// grow extends the slice past key, by at least a quarter so that keys handed
// out one by one cost amortised O(1) and the slack stays under a quarter.
func (d *denseIndex[K]) grow(key K) {
	old := len(d.nodes)
	size := max(int(key)+1, old+old/4, 64)
	d.nodes = append(d.nodes, make([]int32, size-old)...)
	fillAbsent(d.nodes[old:])
}

func (d *denseIndex[K]) del(key K) {
	d.nodes[key] = -1
	d.n--
}

func (d *denseIndex[K]) len() int { return d.n }

func fillAbsent(s []int32) {
	for i := range s {
		s[i] = -1
	}
}
