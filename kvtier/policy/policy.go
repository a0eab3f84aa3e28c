// Package policy holds kvtier's eviction policies and admission filters. Each
// is a small generic core with no locking inside: the caller (the block
// manager) holds its own lock around every call. Policies decide; the caller
// acts.
//
// Each policy comes in two kinds: NewX for any comparable key (a map from key
// to node) and NewDenseX for Dense keys such as the block manager's BlockRef
// (a slice indexed by the key, no map at all).
//
// Policies keep their per-key state in index-based slabs of plain values (no
// pointer per key) so that tens of millions of resident blocks do not burden
// the Go garbage collector, and they allocate nothing on Touch or Evict once
// their slabs have grown.
package policy

// Meta describes a key to cost-aware policies; the others ignore it.
type Meta struct {
	// Bytes is the key's size in the tier.
	Bytes int64
	// RecomputeSeconds is what losing the key would cost, in seconds of prefill
	// (kvtier/cost). A block deep in a long prefix costs more to recompute
	// than an early one. Zero means unknown.
	RecomputeSeconds float64
}

// Policy orders the keys resident in one tier for eviction.
//
// The caller MUST call Insert once for a key that enters the tier, Touch on
// each use, and Remove when the key leaves the tier other than through Evict.
type Policy[K comparable] interface {
	// Insert adds a key that is not yet tracked.
	Insert(key K, meta Meta)
	// Touch records a use of a tracked key; untracked keys are ignored.
	Touch(key K)
	// Remove forgets a key; untracked keys are ignored.
	Remove(key K)
	// Evict picks a victim among tracked keys for which evictable returns
	// true, forgets it and returns it. ok is false when no key is evictable.
	// A key for which evictable returns false (a block in use) counts as
	// just used: it goes where a touched key goes, so that eviction does
	// not walk the same in-use keys on every call while many requests are
	// in flight.
	Evict(evictable func(K) bool) (victim K, ok bool)
	// Len is the number of tracked keys.
	Len() int
}

// Admitter filters what may enter a tier, to spare an NVMe drive's endurance
// from blocks that are written once and never read.
type Admitter[K comparable] interface {
	// Record notes one access of key.
	Record(key K)
	// Admit reports whether key may enter the tier now.
	Admit(key K) bool
}
