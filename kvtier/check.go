package kvtier

import "kvtier.dev/internal/invariants"

// checkInvariants walks all metadata and panics on any inconsistency: a tier
// over capacity, a slot held twice or both held and free, a record not in the
// index or indexed with another token hash, a policy tracking a different
// number of blocks than hold slots, a tenant over its cap or miscounted, a
// pin flag without its pin.
// O(records); called under the write lock, only with the invariants build tag (sampled)
// and from tests.
func (m *Manager) checkInvariants() {
	fail := invariants.Failf
	var owner [NumTiers]map[Slot]BlockRef
	var tracked [NumTiers]int
	for t := range NumTiers {
		ts := &m.tiers[t]
		owner[t] = make(map[Slot]BlockRef)
		if uint32(len(ts.free)) > ts.next || ts.next > ts.slots {
			fail("%v: %d free of %d handed out, %d slots", t, len(ts.free), ts.next, ts.slots)
		}
		for _, s := range ts.free {
			if uint32(s) >= ts.next {
				fail("%v: free slot %d never handed out", t, s)
			}
			if _, dup := owner[t][s]; dup {
				fail("%v: slot %d free twice", t, s)
			}
			owner[t][s] = noRef
		}
	}
	freeRec := make(map[BlockRef]bool, len(m.recs.free))
	for _, f := range m.recs.free {
		freeRec[f] = true
	}
	live, xfers := 0, 0
	var hbuf []byte
	for i := uint32(0); i < m.recs.n; i++ {
		ref := BlockRef(i)
		if freeRec[ref] {
			continue
		}
		live++
		r := m.recs.at(ref)
		if e := m.index.entry(indexKey(r.salt, r.key)); e == nil || BlockRef(e.val-1) != ref {
			fail("record %d (key %#x) not indexed", ref, uint64(r.key))
		} else if th := m.indexedTokenHash(ref, r, &hbuf); e.tokens != th {
			fail("record %d (key %#x): token hash %#x indexed, its tokens hash to %#x", ref, uint64(r.key), e.tokens, th)
		}
		if !r.resident() && r.refs == 0 {
			fail("record %d (key %#x) holds nothing and is not free", ref, uint64(r.key))
		}
		if r.flags&flagInvalid != 0 && r.refs == 0 {
			fail("record %d (key %#x) is invalidated and unused but still resident", ref, uint64(r.key))
		}
		if c := int(r.copying[0]) + int(r.copying[1]) + int(r.copying[2]); c != 2*int(r.xfers) || uint32(r.xfers) > r.refs {
			fail("record %d (key %#x): %d copies holding %d of its %d references, %v slots copied per tier", ref, uint64(r.key), r.xfers, r.xfers, r.refs, r.copying)
		}
		xfers += int(r.xfers)
		for t, s := range r.state {
			if s == stateNone && r.copying[t] != 0 {
				fail("record %d (key %#x): %d copies of its %v slot, which it does not hold", ref, uint64(r.key), r.copying[t], Tier(t))
			}
		}
		for t, s := range r.state {
			if s == stateNone {
				if r.slot[t] != noSlot {
					fail("record %d has slot %d in %v but no state", ref, r.slot[t], Tier(t))
				}
				continue
			}
			if !m.tiers[t].present {
				fail("record %d in absent tier %v", ref, Tier(t))
			}
			if s == stateWriting || s == stateReady {
				tracked[t]++
			}

			sl := r.slot[t]
			if uint32(sl) >= m.tiers[t].next {
				fail("record %d: %v slot %d never handed out", ref, Tier(t), sl)
			}
			if o, dup := owner[t][sl]; dup {
				fail("%v slot %d held by record %d and %d (noRef: free)", Tier(t), sl, ref, o)
			}
			owner[t][sl] = ref
		}
	}
	if inFlight := m.copiesFrom[GPU] + m.copiesFrom[Host] + m.copiesFrom[NVMe]; inFlight != xfers {
		fail("%d copies in flight by their sources %v, %d by their blocks", inFlight, m.copiesFrom, xfers)
	}
	if live != m.index.len() {
		fail("%d live records, %d indexed", live, m.index.len())
	}
	for t := range NumTiers {
		ts := &m.tiers[t]
		if !ts.present {
			continue
		}
		if uint32(len(owner[t])) != ts.next {
			fail("%v: %d slots accounted for, %d handed out (a slot leaked)", t, len(owner[t]), ts.next)
		}
		if n := ts.policy.Len(); m.ten == nil && n != tracked[t] {
			fail("%v: policy tracks %d blocks, %d are writing or ready", t, n, tracked[t])
		}
	}
	m.checkTenantsAndPins(freeRec)
}

// checkTenantsAndPins fails if a tenant group's policy, resident count or
// cap disagrees with its records, or a pin flag with the pins. freeRec
// are the free records.
func (m *Manager) checkTenantsAndPins(freeRec map[BlockRef]bool) {
	var groups []tenantTally
	if m.ten != nil {
		groups = make([]tenantTally, len(m.ten.groups))
	}
	pinned := 0
	for i := uint32(0); i < m.recs.n; i++ {
		ref := BlockRef(i)
		if freeRec[ref] {
			continue
		}
		r := m.recs.at(ref)
		if _, ok := m.pins.of[ref]; ok != (r.flags&flagPinned != 0) {
			invariants.Failf("record %d (key %#x): pin flag %v, in the pins %v", ref, uint64(r.key), r.flags&flagPinned != 0, ok)
		}
		if r.flags&flagPinned != 0 {
			pinned++
		}
		if groups == nil {
			continue
		}
		g := &groups[m.ten.of(r.salt)]
		for t, s := range r.state {
			if s != stateNone {
				g.resident[t]++
			}
			if s == stateWriting || s == stateReady {
				g.tracked[t]++
			}
		}
	}
	if pinned != len(m.pins.of) {
		invariants.Failf("%d blocks flagged pinned, %d pins", pinned, len(m.pins.of))
	}
	var levels [MaxPriority + 1]int32
	var resident [NumTiers][MaxPriority + 1]int32
	for ref, p := range m.pins.of {
		levels[p.priority]++
		for t, s := range m.recs.at(ref).state {
			if s != stateNone {
				resident[t][p.priority]++
			}
		}
	}
	if levels != m.pins.levels || resident != m.pins.resident {
		invariants.Failf("pins per priority %v, counted %v; per tier %v, counted %v", m.pins.levels, levels, m.pins.resident, resident)
	}
	for t := range NumTiers {
		for g := range groups {
			if m.tiers[t].present {
				m.ten.check(g, t, groups[g])
			}
		}
	}
}

// tenantTally is what checkInvariants counted of one tenant group.
type tenantTally struct {
	resident, tracked [NumTiers]int64
}

// check fails if group g's policy, resident count or cap in tier t
// disagrees with what the walk counted.
func (ten *tenants) check(g int, t Tier, n tenantTally) {
	gr := &ten.groups[g]
	if k := int64(gr.policy[t].Len()); k != n.tracked[t] {
		invariants.Failf("%v: tenant %s's policy tracks %d blocks, %d are writing or ready", t, gr.name, k, n.tracked[t])
	}
	if gr.resident[t] != n.resident[t] {
		invariants.Failf("%v: tenant %s counts %d resident blocks, holds %d", t, gr.name, gr.resident[t], n.resident[t])
	}
	if gr.cap[t] > 0 && n.resident[t] > gr.cap[t] {
		invariants.Failf("%v: tenant %s holds %d slots, over its cap of %d", t, gr.name, n.resident[t], gr.cap[t])
	}
}

const noRef = ^BlockRef(0)

// indexedTokenHash is the token hash r's index entry should hold: that of
// its tokens, 0 without them; buf is the hashing's scratch.
func (m *Manager) indexedTokenHash(ref BlockRef, r *record, buf *[]byte) uint32 {
	if r.flags&flagTokens == 0 {
		return 0
	}
	var th uint32
	th, *buf = blockTokenHash(*buf, r.salt, m.recs.tokensOf(ref))
	return th
}
