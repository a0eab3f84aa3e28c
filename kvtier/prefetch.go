package kvtier

import "fmt"

// Prefetch copies the cached blocks of tokens' prefix (salt's) whose fastest
// ready copy is slower than to into to, as background copies, and returns how
// many it started, at most maxBlocks (0: no bound). It records no use of the
// blocks, evicts as a copy does, and stops at the first block it finds no slot for.
func (m *Manager) Prefetch(salt Salt, tokens []int32, to Tier, maxBlocks int) (int, error) {
	var l Lease
	if err := m.checkPrefetch("Prefetch", to, maxBlocks, &l); err != nil {
		return 0, err
	}
	l.keys, l.buf = appendKeys(l.keys[:0], l.buf, m.blockTokens, salt, 0, tokens)
	m.hook(l.keys)
	m.lookup(salt, l.keys, tokens, &l)
	return m.prefetch(&l, to, maxBlocks), nil
}

// PrefetchKeys is Prefetch for callers that computed the block keys
// themselves.
func (m *Manager) PrefetchKeys(salt Salt, keys []Key, to Tier, maxBlocks int) (int, error) {
	var l Lease
	if err := m.checkPrefetch("PrefetchKeys", to, maxBlocks, &l); err != nil {
		return 0, err
	}
	m.lookup(salt, keys, nil, &l)
	return m.prefetch(&l, to, maxBlocks), nil
}

func (m *Manager) checkPrefetch(op string, to Tier, maxBlocks int, l *Lease) error {
	if err := m.checkTier(op, to); err != nil {
		return err
	}
	if to == GPU {
		return fmt.Errorf("%w: %s: into the gpu tier is Onboard", ErrBadInput, op)
	}
	if maxBlocks < 0 {
		return fmt.Errorf("%w: %s: maxBlocks %d is negative", ErrBadInput, op, maxBlocks)
	}
	return m.begin(l)
}

// prefetch starts the copies of l's blocks into to and releases l without
// recording its lookup.
func (m *Manager) prefetch(l *Lease, to Tier, maxBlocks int) int {
	l.lookup = false // the request's own lookup records the uses
	n := 0
	m.lock()
	for i := range l.Blocks {
		r := m.recs.at(l.Blocks[i].Ref)
		from := r.best()
		if from == NumTiers || from <= to || r.state[to] != stateNone {
			continue
		}
		slot, ok := m.alloc(to, 1, r.salt)
		if !ok {
			break
		}
		m.startCopy(m.background(), l.Blocks[i].Ref, from, to, slot)
		if n++; n == maxBlocks {
			break
		}
	}
	m.unlockAndSubmit(nil)
	m.Release(l)
	return n
}
