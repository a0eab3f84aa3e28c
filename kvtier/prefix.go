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

// prefixScratch is CachedPrefix's little-endian copy of a block's tokens
// where their memory is big-endian, pooled so that the query allocates
// nothing once warm.
type prefixScratch struct{ buf []byte }

var prefixScratchPool = sync.Pool{New: func() any { return new(prefixScratch) }}

// CachedPrefix reports how much of tokens' full blocks (salt's) the cache
// holds now, with no side effect: no lease, no policy touch, no admission
// record, no counter. What it reports can change as soon as it returns; a
// Lookup with nothing in between finds it.
//
// It verifies a block as Lookup does (salt, parent key, position, stored
// with tokens) except that it compares 32 bits of the tokens' own hash,
// kept in the index, instead of the stored tokens. Since the key chains
// that hash, a false hit needs two different blocks of tokens after the
// same parent with equal 64-bit token hashes (XXH3, seeded with the salt),
// or with equal keys and equal 32-bit parts of them: at random, about
// 2^-64 for each such pair. Lookup compares the tokens: a false hit here
// overstates what it will lease, never leases a wrong block.
func (m *Manager) CachedPrefix(salt Salt, tokens []int32) PrefixInfo {
	if tokens == nil {
		tokens = []int32{}
	}
	if inlineKeys {
		return m.cachedPrefix(salt, nil, tokens, nil)
	}
	sc := prefixScratchPool.Get().(*prefixScratch)
	p := m.cachedPrefix(salt, nil, tokens, sc)
	prefixScratchPool.Put(sc)
	return p
}

// CachedPrefixKeys is CachedPrefix for callers that computed the block
// keys themselves; hits are verified by salt, parent key and position.
func (m *Manager) CachedPrefixKeys(salt Salt, keys []Key) PrefixInfo {
	if keys == nil {
		keys = []Key{}
	}
	return m.cachedPrefix(salt, keys, nil, nil)
}

// cachedPrefix walks the blocks as lookup does (holes included) under one
// stripe's read lock, writing nothing but its result. Exactly one of keys
// and tokens is non-nil; with tokens it hashes their blocks itself (sc
// holds their little-endian copy where inlineKeys is false), a batch at a
// time, and stops hashing where the walk stops.
//
// A batch goes in two passes. The first hashes its blocks and probes the
// index for each: only the short outer hash of a key waits on the key
// before (internal/blockkey), so the core hashes blocks side by side and
// runs each probe in their shadow; the probe's entry holds the block's
// token hash, compared there. The second reads the records, with every key
// and probe known, so that their loads overlap with each other instead of
// waiting behind the chain.
func (m *Manager) cachedPrefix(salt Salt, keys []Key, tokens []int32, sc *prefixScratch) PrefixInfo {
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
	hook := m.testKeyHook
	// A hit has flags&mask == want: not invalidated, stored with tokens
	// when asked by tokens.
	mask, want := flagInvalid, uint8(0)
	if tokens != nil {
		mask, want = flagInvalid|flagTokens, flagTokens
	}
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
				e := m.index.entry(bkeys[j] ^ mix)
				if found[j] = e != nil; found[j] {
					refs[j] = e.val - 1
				}
				continue
			}
			tok := tokens[(base+j)*bt:][:bt]
			var le []byte
			if inlineKeys {
				le = tokenBytes(tok)
			} else {
				le, sc.buf = leTokens(sc.buf, tok)
			}
			b := blockkey.Block(uint64(salt), le)
			chain = Key(blockkey.Chain(uint64(chain), b))
			bkeys[j] = chain
			if hook != nil {
				bkeys[j] = hook(chain)
			}
			e := m.index.entry(bkeys[j] ^ mix)
			if found[j] = e != nil && e.tokens == tokenHash(b); found[j] {
				refs[j] = e.val - 1
			}
		}
		for j := range c {
			i := base + j
			var ready uint8 // bit t: the block is ready in tier t
			if found[j] {
				r := m.recs.at(BlockRef(refs[j]))
				if r.is(salt, parent, i) && r.flags&mask == want {
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
