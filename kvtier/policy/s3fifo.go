package policy

import "kvtier.dev/internal/invariants"

// S3FIFO is the S3-FIFO policy of Yang et al. ("FIFO queues are all you need
// for cache eviction", SOSP 2023). A new key enters the small FIFO S; a key
// inserted again while the ghost FIFO G remembers it enters the main FIFO M.
// Each use raises a key's counter, capped at 3. When S holds at least 10% of
// the tracked keys, eviction takes S's oldest key: if it was used while in S
// it moves to M with its counter cleared, else it is evicted and remembered
// in G. Otherwise eviction takes M's oldest key: a key with a non-zero
// counter goes back to M's front with its counter lowered by one, a key at
// zero is evicted. G remembers up to 90% of the capacity hint, the share of
// M. Most one-hit keys leave quickly through S without touching M.
//
// S3FIFO has no locking inside; the caller serialises every call.
type S3FIFO[K comparable] struct {
	s         queueSlab[K]
	ghostKeys int // G's bound
	checks    sampler
}

const (
	s3Small = 0
	s3Main  = 1
	s3Ghost = 2
	s3Max   = 3 // the counter's cap
)

var _ Policy[uint64] = (*S3FIFO[uint64])(nil)

// NewS3FIFO returns an empty S3FIFO sized for capacity resident keys; its
// ghost queue remembers up to 90% of capacity evicted keys (at least 1).
// capacity is a hint, not a limit: the caller decides when to Evict.
func NewS3FIFO[K comparable](capacity int) (*S3FIFO[K], error) {
	return newS3FIFO("NewS3FIFO", capacity, func(n int) keyIndex[K] { return make(mapIndex[K], n) })
}

// NewDenseS3FIFO is NewS3FIFO for Dense keys, with a slice instead of a map
// from key to node, as NewDenseLRU.
//
// A ghost entry (a key evicted from S that G remembers) outlives the key's
// block: when the caller frees a key and hands it out again for a new block,
// as the block manager does with BlockRef, the new block's Insert finds the
// ghost and enters M instead of S. That only misplaces the new block in the
// eviction order; it never makes a key tracked that was not inserted. The
// map variant behaves the same with reused keys.
func NewDenseS3FIFO[K Dense](capacity int) (*S3FIFO[K], error) {
	return newS3FIFO("NewDenseS3FIFO", capacity, func(n int) keyIndex[K] { return newDenseIndex[K](n) })
}

func newS3FIFO[K comparable](constructor string, capacity int, index func(capacity int) keyIndex[K]) (*S3FIFO[K], error) {
	if capacity <= 0 || capacity >= maxNodes/2 {
		return nil, argError(constructor, "capacity", capacity, "1 to 2^30-1 keys")
	}
	ghost := max(1, capacity*9/10)
	return &S3FIFO[K]{s: newQueueSlab(3, capacity+ghost, index(capacity+ghost)), ghostKeys: ghost}, nil
}

// Insert tracks key: in M when G remembers it, else in S. Inserting a
// tracked key touches it. meta is ignored.
func (p *S3FIFO[K]) Insert(key K, _ Meta) {
	i, ok := p.s.lookup(key)
	switch {
	case !ok:
		p.s.add(s3Small, key)
	case p.s.nodes[i].queue == s3Ghost:
		p.s.moveToFront(s3Main, i)
		p.s.nodes[i].freq = 0
	default:
		p.touch(i)
	}
	p.check()
}

// Touch raises a tracked key's counter (up to 3); no key moves.
func (p *S3FIFO[K]) Touch(key K) {
	if i, ok := p.s.lookup(key); ok {
		p.touch(i)
	}
}

func (p *S3FIFO[K]) touch(i int32) {
	n := &p.s.nodes[i]
	if n.queue != s3Ghost && n.freq < s3Max {
		n.freq++
	}
}

// Remove forgets a tracked key. A key only remembered in G stays there.
func (p *S3FIFO[K]) Remove(key K) {
	if i, ok := p.s.lookup(key); ok && p.s.nodes[i].queue != s3Ghost {
		p.s.del(i)
		p.check()
	}
}

// Evict removes and returns a key for which evictable returns true (a nil
// evictable accepts every key), as the type's comment describes; when the
// queue it starts with has no evictable key it tries the other. Keys it
// skips keep their place and their counter. The cost is one step per key
// passed, in use or reinserted; M's keys are reinserted at most 3 times each
// before one reaches zero, so a call takes at most about 4 walks of M, and
// when nothing is evictable it walks S once and M once (ok false).
func (p *S3FIFO[K]) Evict(evictable func(K) bool) (victim K, ok bool) {
	if p.s.lens[s3Small] >= max(1, p.Len()/10) || p.s.lens[s3Main] == 0 {
		if victim, ok = p.evictSmall(evictable); !ok {
			victim, ok = p.evictMain(evictable)
		}
	} else if victim, ok = p.evictMain(evictable); !ok {
		victim, ok = p.evictSmall(evictable)
	}
	if ok {
		p.check()
	}
	return victim, ok
}

// evictSmall walks S from its oldest key, moving used keys to M, until it
// finds an unused evictable key, which it evicts into G.
func (p *S3FIFO[K]) evictSmall(evictable func(K) bool) (victim K, ok bool) {
	i := p.s.back(s3Small)
	for range p.s.lens[s3Small] {
		n := &p.s.nodes[i]
		prev := n.prev
		if evictable != nil && !evictable(n.key) {
			// In use: to the front of S, so that the next Evict does not
			// walk it again (see LRU.Evict).
			p.s.moveToFront(s3Small, i)
			i = prev
			continue
		}
		if n.freq > 0 {
			n.freq = 0
			p.s.moveToFront(s3Main, i)
			i = prev
			continue
		}
		victim = n.key
		p.s.moveToFront(s3Ghost, i)
		for p.s.lens[s3Ghost] > p.ghostKeys {
			p.s.del(p.s.back(s3Ghost))
		}
		return victim, true
	}
	return victim, false
}

// evictMain walks M from its oldest key, reinserting evictable keys whose
// counter is not zero, until it finds one at zero. A lap that meets no
// evictable key ends the walk; a lap that meets one lowers its counter or
// evicts it, so at most s3Max+1 laps are needed.
func (p *S3FIFO[K]) evictMain(evictable func(K) bool) (victim K, ok bool) {
	for {
		sawEvictable := false
		i := p.s.back(s3Main)
		for range p.s.lens[s3Main] {
			n := &p.s.nodes[i]
			prev := n.prev
			if evictable != nil && !evictable(n.key) {
				p.s.moveToFront(s3Main, i) // in use: as evictSmall
				i = prev
				continue
			}
			sawEvictable = true
			if n.freq > 0 {
				n.freq--
				p.s.moveToFront(s3Main, i)
				i = prev
				continue
			}
			victim = n.key
			p.s.del(i)
			return victim, true
		}
		if !sawEvictable {
			return victim, false
		}
	}
}

// Len is the number of tracked keys (S and M; G's keys are not tracked).
func (p *S3FIFO[K]) Len() int { return p.s.lens[s3Small] + p.s.lens[s3Main] }

// Contains reports whether key is tracked, without touching it.
func (p *S3FIFO[K]) Contains(key K) bool {
	i, ok := p.s.lookup(key)
	return ok && p.s.nodes[i].queue != s3Ghost
}

func (p *S3FIFO[K]) check() {
	if p.checks.due(p.Len()) {
		p.s.check()
		invariants.Check(p.s.lens[s3Ghost] <= p.ghostKeys,
			"policy: S3FIFO: G holds %d keys, bound %d", p.s.lens[s3Ghost], p.ghostKeys)
		for i := p.s.nodes[s3Ghost].next; !p.s.isSentinel(i); i = p.s.nodes[i].next {
			invariants.Check(p.s.nodes[i].freq == 0, "policy: S3FIFO: ghost node %d has counter %d", i, p.s.nodes[i].freq)
		}
	}
}
