package policy

import "kvtier.dev/internal/invariants"

// TwoQ is the full 2Q policy of Johnson and Shasha (VLDB 1994): a new key
// enters A1in, a FIFO; a key evicted from A1in is remembered (key only) in the
// ghost FIFO A1out; a key inserted again while remembered enters Am, an LRU
// of keys that proved they are reused. Hits in A1in do nothing: a block
// touched several times by one request is a correlated reference, not
// evidence of reuse. A1in is kept to a quarter of the tracked keys and A1out
// remembers up to half the capacity hint, the paper's settings.
//
// 2Q was chosen over ARC because it is built from the same FIFO and LRU
// queues as the other policies and its queue targets are fixed, so skipping
// in-use keys cannot push it into a state it was not designed for. ARC's
// adaptation assumes the victim it picks can always be evicted, and moves its
// target on every ghost hit; with many blocks pinned by requests that target
// drifts without meaning. (S3FIFO covers scan resistance with FIFOs too.)
//
// TwoQ has no locking inside; the caller serialises every call.
type TwoQ[K comparable] struct {
	s         queueSlab[K]
	ghostKeys int // A1out's bound
	checks    sampler
}

const (
	twoQIn    = 0 // A1in: FIFO of keys seen once
	twoQMain  = 1 // Am: LRU of reused keys
	twoQGhost = 2 // A1out: keys recently evicted from A1in
)

var _ Policy[uint64] = (*TwoQ[uint64])(nil)

// NewTwoQ returns an empty TwoQ sized for capacity resident keys; A1out
// remembers up to capacity/2 evicted keys (at least 1). capacity is a hint
// for the resident keys, not a limit: the caller decides when to Evict.
func NewTwoQ[K comparable](capacity int) (*TwoQ[K], error) {
	return newTwoQ("NewTwoQ", capacity, func(n int) keyIndex[K] { return make(mapIndex[K], n) })
}

// NewDenseTwoQ is NewTwoQ for Dense keys, with a slice instead of a map from
// key to node, as NewDenseLRU.
//
// A ghost entry (a key evicted from A1in that A1out remembers) outlives the
// key's block: when the caller frees a key and hands it out again for a new
// block, as the block manager does with BlockRef, the new block's Insert
// finds the ghost and enters Am as if it were reused. That only misplaces the
// new block in the eviction order (it is protected as reused); it never makes
// a key tracked that was not inserted. Calling Remove after Evict does not
// forget a ghost. The map variant behaves the same with reused keys.
func NewDenseTwoQ[K Dense](capacity int) (*TwoQ[K], error) {
	return newTwoQ("NewDenseTwoQ", capacity, func(n int) keyIndex[K] { return newDenseIndex[K](n) })
}

func newTwoQ[K comparable](constructor string, capacity int, index func(capacity int) keyIndex[K]) (*TwoQ[K], error) {
	if capacity <= 0 || capacity >= maxNodes/2 {
		return nil, argError(constructor, "capacity", capacity, "1 to 2^30-1 keys")
	}
	ghost := max(1, capacity/2)
	return &TwoQ[K]{s: newQueueSlab(3, capacity+ghost, index(capacity+ghost)), ghostKeys: ghost}, nil
}

// Insert tracks key: in Am when A1out remembers it, else in A1in. Inserting a
// tracked key touches it. meta is ignored.
func (p *TwoQ[K]) Insert(key K, _ Meta) {
	i, ok := p.s.lookup(key)
	switch {
	case !ok:
		p.s.add(twoQIn, key)
	case p.s.nodes[i].queue == twoQGhost:
		p.s.moveToFront(twoQMain, i)
	default:
		p.touch(i)
	}
	p.check()
}

// Touch records a use of a tracked key: a key in Am becomes its most
// recently used; a key in A1in stays where it is.
func (p *TwoQ[K]) Touch(key K) {
	if i, ok := p.s.lookup(key); ok {
		p.touch(i)
	}
}

func (p *TwoQ[K]) touch(i int32) {
	if p.s.nodes[i].queue == twoQMain {
		p.s.moveToFront(twoQMain, i)
	}
}

// Remove forgets a tracked key. A key only remembered in A1out stays there.
func (p *TwoQ[K]) Remove(key K) {
	if i, ok := p.s.lookup(key); ok && p.s.nodes[i].queue != twoQGhost {
		p.s.del(i)
		p.check()
	}
}

// Evict removes and returns a key for which evictable returns true (a nil
// evictable accepts every key): the oldest of A1in when A1in holds more than
// a quarter of the tracked keys (the key is then remembered in A1out), else
// the least recently used of Am. When the chosen queue has no evictable key
// the other one is tried. Skipped keys keep their place; the cost is one step
// per in-use key passed, and a walk of every key when none is evictable.
func (p *TwoQ[K]) Evict(evictable func(K) bool) (victim K, ok bool) {
	first, second := uint8(twoQMain), uint8(twoQIn)
	if p.s.lens[twoQIn] > max(1, p.Len()/4) || p.s.lens[twoQMain] == 0 {
		first, second = twoQIn, twoQMain
	}
	for _, q := range [2]uint8{first, second} {
		i := p.s.back(q)
		for range p.s.lens[q] {
			key, prev := p.s.nodes[i].key, p.s.nodes[i].prev
			if evictable != nil && !evictable(key) {
				// In use: to the front of its queue, so that the next
				// Evict does not walk it again (see LRU.Evict).
				p.s.moveToFront(q, i)
				i = prev
				continue
			}
			if q == twoQIn {
				p.remember(i)
			} else {
				p.s.del(i)
			}
			p.check()
			return key, true
		}
	}
	return victim, false
}

// remember moves node i to A1out, forgetting A1out's oldest key beyond its
// bound.
func (p *TwoQ[K]) remember(i int32) {
	p.s.moveToFront(twoQGhost, i)
	for p.s.lens[twoQGhost] > p.ghostKeys {
		p.s.del(p.s.back(twoQGhost))
	}
}

// Len is the number of tracked keys (A1in and Am; A1out's keys are not
// tracked).
func (p *TwoQ[K]) Len() int { return p.s.lens[twoQIn] + p.s.lens[twoQMain] }

// Contains reports whether key is tracked, without touching it.
func (p *TwoQ[K]) Contains(key K) bool {
	i, ok := p.s.lookup(key)
	return ok && p.s.nodes[i].queue != twoQGhost
}

func (p *TwoQ[K]) check() {
	if p.checks.due(p.Len()) {
		p.s.check()
		invariants.Check(p.s.lens[twoQGhost] <= p.ghostKeys,
			"policy: TwoQ: A1out holds %d keys, bound %d", p.s.lens[twoQGhost], p.ghostKeys)
	}
}
