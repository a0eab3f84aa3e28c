package kvtier

import (
	"math/bits"
	"sync"

	"kvtier.dev/internal/blockkey"
)

// PrefixInfo is what CachedPrefix reports of a request: how much of it the
// cache holds now, per tier.
type PrefixInfo struct {
	Blocks int // the request's full blocks, those asked about
	// Cached[t] are the tokens of the blocks a Lookup now would lease
	// whose fastest ready copy is in tier t: the sum is what it would
	// lease (with Config.MaxHoleBlocks, blocks after holes too).
	Cached [NumTiers]int
	// Prefix[t] is the longest run of leading tokens ready in tier t,
	// whether or not a faster tier holds them too.
	Prefix [NumTiers]int
}

// CachedTokens is the sum of Cached: the tokens a Lookup would lease.
func (p *PrefixInfo) CachedTokens() int {
	n := 0
	for _, c := range p.Cached {
		n += c
	}
	return n
}

// prefixScratch is CachedPrefix's hashing scratch where keys are hashed
// before the walk, pooled so that the query allocates nothing once warm.
type prefixScratch struct {
	keys []Key
	buf  []byte
}

var prefixScratchPool = sync.Pool{New: func() any { return new(prefixScratch) }}

// CachedPrefix reports how much of tokens' full blocks (salt's) the cache
// holds now, verified as Lookup verifies, with no side effect: no lease,
// no policy touch, no admission record, no counter. What it reports can
// change as soon as it returns; a Lookup with nothing in between finds it.
func (m *Manager) CachedPrefix(salt Salt, tokens []int32) PrefixInfo {
	if inlineKeys && m.testKeyHook == nil {
		return m.cachedPrefix(salt, nil, tokens) // keys hashed in the walk
	}
	sc := prefixScratchPool.Get().(*prefixScratch)
	sc.keys, sc.buf = appendKeys(sc.keys[:0], sc.buf, m.blockTokens, salt, 0, tokens)
	m.hook(sc.keys)
	p := m.cachedPrefix(salt, sc.keys, tokens)
	prefixScratchPool.Put(sc)
	return p
}

// CachedPrefixKeys is CachedPrefix for callers that computed the block
// keys themselves; hits are verified by salt, parent key and position.
func (m *Manager) CachedPrefixKeys(salt Salt, keys []Key) PrefixInfo {
	if keys == nil {
		keys = []Key{}
	}
	return m.cachedPrefix(salt, keys, nil)
}

// cachedPrefix walks the blocks as lookup does (holes included) under one
// stripe's read lock, writing nothing but its result. With keys nil it
// hashes tokens' blocks itself (inlineKeys only), a batch at a time, and
// stops hashing where the walk stops.
//
// A batch goes in two passes. The first hashes its blocks and probes the
// index for each: only the short outer hash of a key waits on the key
// before (internal/blockkey), so the core hashes blocks side by side and
// runs each probe in their shadow. The second reads the records and compares
// the tokens, with every key and probe known, so that their loads overlap
// with each other instead of waiting behind the chain.
func (m *Manager) cachedPrefix(salt Salt, keys []Key, tokens []int32) PrefixInfo {
	bt := m.blockTokens
	n := len(keys)
	if keys == nil {
		n = len(tokens) / bt
	}
	p := PrefixInfo{Blocks: n}
	var open uint8         // bit t: tier t's leading run goes on
	var runs [NumTiers]int // tier t's leading run, in blocks, once it ended
	for t := range NumTiers {
		if m.tiers[t].present {
			open |= 1 << t
		}
	}
	const batch = 32
	var bkeys [batch]Key
	var refs [batch]uint32
	var found [batch]bool
	mix := saltMix(salt)
	st := &m.stripes[0]
	m.rlock(st)
	parent, chain := Key(0), Key(0) // the walk's parent; the hashing's
	holes, walked := 0, 0
blocks:
	for base := 0; base < n; base += batch {
		c := min(batch, n-base)
		for j := range c {
			if keys != nil {
				bkeys[j] = keys[base+j]
			} else {
				i := base + j
				chain = Key(blockkey.Next(uint64(salt), uint64(chain), tokenBytes(tokens[i*bt:(i+1)*bt])))
				bkeys[j] = chain
			}
			refs[j], found[j] = m.index.findMixed(bkeys[j] ^ mix)
		}
		for j := range c {
			i := base + j
			var ready uint8 // bit t: the block is ready in tier t
			if found[j] {
				ref := BlockRef(refs[j])
				r := m.recs.at(ref)
				var tok []int32
				if tokens != nil {
					tok = tokens[i*bt : (i+1)*bt : (i+1)*bt]
				}
				if m.verify(ref, r, salt, parent, i, tok) && r.flags&flagInvalid == 0 {
					ready = r.readyTiers()
				}
			}
			if ready == 0 {
				if holes == m.maxHoles {
					break blocks
				}
				holes++
			} else {
				p.Cached[bits.TrailingZeros8(ready)] += bt // the fastest
			}
			if ended := open &^ ready; ended != 0 {
				for t := range NumTiers {
					if ended&(1<<t) != 0 {
						runs[t] = i
					}
				}
				open &= ready
			}
			parent = bkeys[j]
			walked = i + 1
		}
	}
	m.runlock(st)
	for t := range NumTiers {
		if open&(1<<t) != 0 {
			runs[t] = walked
		}
		p.Prefix[t] = runs[t] * bt
	}
	return p
}
