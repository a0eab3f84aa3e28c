package kvtier

import "sync"

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

// prefixScratch is CachedPrefix's hashing scratch, pooled so that the
// query allocates nothing once warm.
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
	return m.cachedPrefix(salt, keys, nil)
}

// cachedPrefix walks keys as lookup does (holes included, index probes in
// batches) under one stripe's read lock, writing nothing but its result.
func (m *Manager) cachedPrefix(salt Salt, keys []Key, tokens []int32) PrefixInfo {
	p := PrefixInfo{Blocks: len(keys)}
	bt := m.blockTokens
	var open [NumTiers]bool // tier t's leading run goes on
	for t := range NumTiers {
		open[t] = m.tiers[t].present
	}
	const batch = 16
	var refs [batch]uint32
	var found [batch]bool
	st := &m.stripes[0]
	m.rlock(st)
	parent := Key(0)
	holes := 0
blocks:
	for base := 0; base < len(keys); base += batch {
		n := min(batch, len(keys)-base)
		for j := range n {
			refs[j], found[j] = m.index.find(salt, keys[base+j])
		}
		for j := range n {
			i := base + j
			ok := found[j]
			best := NumTiers
			var r *record
			if ok {
				ref := BlockRef(refs[j])
				r = m.recs.at(ref)
				var tok []int32
				if tokens != nil {
					tok = tokens[i*bt : (i+1)*bt]
				}
				if m.verify(ref, r, salt, parent, i, tok) && r.flags&flagInvalid == 0 {
					best = r.best()
				}
				ok = best != NumTiers
			}
			for t := range NumTiers {
				if open[t] && ok && r.state[t] == stateReady {
					p.Prefix[t] += bt
				} else {
					open[t] = false
				}
			}
			if ok {
				p.Cached[best] += bt
			} else {
				if holes == m.maxHoles {
					break blocks
				}
				holes++
			}
			parent = keys[i]
		}
	}
	m.runlock(st)
	return p
}
