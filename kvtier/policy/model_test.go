package policy

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// A model is a slow, obviously correct reference of one policy: queues are
// slices with the front (newest) first, scanned linearly.
type model interface {
	insert(k uint64, m Meta)
	touch(k uint64)
	remove(k uint64)
	evict(evictable func(uint64) bool) (uint64, bool)
	len() int
}

// checkAgainstModel applies the same random operations to p and m and fails
// at the first victim or Len that differs.
func checkAgainstModel(t *testing.T, p Policy[uint64], m model, seed uint64, keys uint64, steps int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed+1))
	inUse := map[uint64]bool{}
	evictable := func(k uint64) bool { return !inUse[k] }
	for step := range steps {
		k := rng.Uint64N(keys)
		switch op := rng.IntN(16); {
		case op < 6:
			meta := Meta{Bytes: int64(1 + rng.IntN(8)), RecomputeSeconds: rng.Float64()}
			p.Insert(k, meta)
			m.insert(k, meta)
		case op < 10:
			p.Touch(k)
			m.touch(k)
		case op < 11:
			p.Remove(k)
			m.remove(k)
		case op < 12:
			inUse[k] = !inUse[k]
		default:
			f := evictable
			if op == 15 {
				f = nil
			}
			got, gotOK := p.Evict(f)
			want, wantOK := m.evict(f)
			if got != want || gotOK != wantOK {
				t.Fatalf("step %d: Evict = %d, %v; model says %d, %v", step, got, gotOK, want, wantOK)
			}
		}
		if p.Len() != m.len() {
			t.Fatalf("step %d: Len = %d; model says %d", step, p.Len(), m.len())
		}
	}
}

// withBothIndexes runs f on the policy named name built with a map index and
// with a dense index.
func withBothIndexes(t *testing.T, name string, capacity int, f func(t *testing.T, p tracker)) {
	ran := 0
	for _, np := range allPolicies {
		if np.name != name && np.name != "Dense"+name {
			continue
		}
		t.Run(np.name, func(t *testing.T) { f(t, mustMake(t, np, capacity)) })
		ran++
	}
	if ran != 2 {
		t.Fatalf("%d policies named %s or Dense%s, want 2", ran, name, name)
	}
}

func TestLRUAgainstModel(t *testing.T) {
	for seed := range uint64(4) {
		withBothIndexes(t, "LRU", 16, func(t *testing.T, p tracker) {
			checkAgainstModel(t, p, &lruModel{}, seed, 48, 20000)
		})
	}
}

// TestLRUAgainstSimpleLRU compares the eviction order with golang-lru's
// simplelru when every key is evictable.
func TestLRUAgainstSimpleLRU(t *testing.T) {
	withBothIndexes(t, "LRU", 64, testLRUAgainstSimpleLRU)
}

func testLRUAgainstSimpleLRU(t *testing.T, p tracker) {
	const capacity = 64
	ref, err := simplelru.NewLRU[uint64, struct{}](capacity, nil)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	for step := range 100000 {
		k := rng.Uint64N(3 * capacity)
		if p.Contains(k) != ref.Contains(k) {
			t.Fatalf("step %d: Contains(%d) = %v, simplelru %v", step, k, p.Contains(k), ref.Contains(k))
		}
		if p.Contains(k) {
			p.Touch(k)
			ref.Get(k)
			continue
		}
		if p.Len() == capacity {
			got, _ := p.Evict(nil)
			want, _, _ := ref.RemoveOldest()
			if got != want {
				t.Fatalf("step %d: evicted %d, simplelru %d", step, got, want)
			}
		}
		p.Insert(k, Meta{})
		ref.Add(k, struct{}{})
	}
}

func TestTwoQAgainstModel(t *testing.T) {
	for seed := range uint64(4) {
		withBothIndexes(t, "TwoQ", 16, func(t *testing.T, p tracker) {
			checkAgainstModel(t, p, &twoQModel{ghostMax: 8}, seed, 48, 20000)
		})
	}
}

func TestS3FIFOAgainstModel(t *testing.T) {
	for seed := range uint64(4) {
		withBothIndexes(t, "S3FIFO", 20, func(t *testing.T, p tracker) {
			checkAgainstModel(t, p, &s3Model{ghostMax: 18, freq: map[uint64]int{}}, seed, 48, 20000)
		})
	}
}

func TestCostAwareAgainstModel(t *testing.T) {
	for seed := range uint64(4) {
		p, _ := NewCostAware[uint64](16, 50)
		dense, _ := newDenseTracker(NewDenseCostAware[ref](16, 50))
		t.Run("CostAware", func(t *testing.T) {
			checkAgainstModel(t, p, &costModel{period: 50, keys: map[uint64]*costEntry{}}, seed, 48, 20000)
		})
		t.Run("DenseCostAware", func(t *testing.T) {
			checkAgainstModel(t, dense, &costModel{period: 50, keys: map[uint64]*costEntry{}}, seed, 48, 20000)
		})
	}
}

// lruModel: front is the most recently used.
type lruModel struct{ q []uint64 }

func (m *lruModel) insert(k uint64, _ Meta) { m.remove(k); m.q = slices.Insert(m.q, 0, k) }
func (m *lruModel) touch(k uint64) {
	if slices.Contains(m.q, k) {
		m.insert(k, Meta{})
	}
}
func (m *lruModel) remove(k uint64) {
	if i := slices.Index(m.q, k); i >= 0 {
		m.q = slices.Delete(m.q, i, i+1)
	}
}

// evict walks from the back; a key in use goes to the front.
func (m *lruModel) evict(f func(uint64) bool) (uint64, bool) {
	for range len(m.q) {
		k := m.q[len(m.q)-1]
		m.q = m.q[:len(m.q)-1]
		if f == nil || f(k) {
			return k, true
		}
		m.q = slices.Insert(m.q, 0, k)
	}
	return 0, false
}
func (m *lruModel) len() int { return len(m.q) }

// twoQModel: in (FIFO), main (LRU) and ghost (FIFO), fronts first.
type twoQModel struct {
	in, main, ghost []uint64
	ghostMax        int
}

func del(q []uint64, k uint64) ([]uint64, bool) {
	if i := slices.Index(q, k); i >= 0 {
		return slices.Delete(q, i, i+1), true
	}
	return q, false
}

func (m *twoQModel) insert(k uint64, _ Meta) {
	var ok bool
	if m.ghost, ok = del(m.ghost, k); ok {
		m.main = slices.Insert(m.main, 0, k)
		return
	}
	if slices.Contains(m.in, k) || slices.Contains(m.main, k) {
		m.touch(k)
		return
	}
	m.in = slices.Insert(m.in, 0, k)
}
func (m *twoQModel) touch(k uint64) {
	var ok bool
	if m.main, ok = del(m.main, k); ok {
		m.main = slices.Insert(m.main, 0, k)
	}
}
func (m *twoQModel) remove(k uint64) {
	m.in, _ = del(m.in, k)
	m.main, _ = del(m.main, k)
}
func (m *twoQModel) evict(f func(uint64) bool) (uint64, bool) {
	fromIn := len(m.in) > max(1, m.len()/4) || len(m.main) == 0
	for range 2 {
		q := &m.main
		if fromIn {
			q = &m.in
		}
		for range len(*q) {
			k := (*q)[len(*q)-1]
			*q = (*q)[:len(*q)-1]
			if f != nil && !f(k) {
				*q = slices.Insert(*q, 0, k) // in use: to the front
				continue
			}
			if fromIn {
				m.ghost = slices.Insert(m.ghost, 0, k)
				if len(m.ghost) > m.ghostMax {
					m.ghost = m.ghost[:m.ghostMax]
				}
			}
			return k, true
		}
		fromIn = !fromIn
	}
	return 0, false
}
func (m *twoQModel) len() int { return len(m.in) + len(m.main) }

// s3Model: small, main and ghost FIFOs, fronts first, and a counter per
// tracked key.
type s3Model struct {
	small, main, ghost []uint64
	freq               map[uint64]int
	ghostMax           int
}

func (m *s3Model) tracked(k uint64) bool {
	return slices.Contains(m.small, k) || slices.Contains(m.main, k)
}
func (m *s3Model) insert(k uint64, _ Meta) {
	var ok bool
	if m.ghost, ok = del(m.ghost, k); ok {
		m.main = slices.Insert(m.main, 0, k)
		m.freq[k] = 0
		return
	}
	if m.tracked(k) {
		m.touch(k)
		return
	}
	m.small = slices.Insert(m.small, 0, k)
	m.freq[k] = 0
}
func (m *s3Model) touch(k uint64) {
	if m.tracked(k) {
		m.freq[k] = min(m.freq[k]+1, 3)
	}
}
func (m *s3Model) remove(k uint64) {
	m.small, _ = del(m.small, k)
	m.main, _ = del(m.main, k)
	delete(m.freq, k)
}
func (m *s3Model) evict(f func(uint64) bool) (uint64, bool) {
	ok := func(k uint64) bool { return f == nil || f(k) }
	small := func() (uint64, bool) {
		for range len(m.small) {
			k := m.small[len(m.small)-1]
			m.small = m.small[:len(m.small)-1]
			if !ok(k) {
				m.small = slices.Insert(m.small, 0, k) // in use: to the front
				continue
			}
			if m.freq[k] > 0 {
				m.freq[k] = 0
				m.main = slices.Insert(m.main, 0, k)
				continue
			}
			delete(m.freq, k)
			m.ghost = slices.Insert(m.ghost, 0, k)
			if len(m.ghost) > m.ghostMax {
				m.ghost = m.ghost[:m.ghostMax]
			}
			return k, true
		}
		return 0, false
	}
	main := func() (uint64, bool) {
		// Rotate: a key with a counter goes to the front, lowered by one;
		// an in-use key goes to the front as it is. A lap that meets no
		// evictable key ends the walk.
		for {
			saw := false
			for range len(m.main) {
				k := m.main[len(m.main)-1]
				m.main = m.main[:len(m.main)-1]
				if !ok(k) {
					m.main = slices.Insert(m.main, 0, k)
					continue
				}
				saw = true
				if m.freq[k] > 0 {
					m.freq[k]--
					m.main = slices.Insert(m.main, 0, k)
					continue
				}
				delete(m.freq, k)
				return k, true
			}
			if !saw {
				return 0, false
			}
		}
	}
	if len(m.small) >= max(1, m.len()/10) || len(m.main) == 0 {
		if k, found := small(); found {
			return k, true
		}
		return main()
	}
	if k, found := main(); found {
		return k, true
	}
	return small()
}
func (m *s3Model) len() int { return len(m.small) + len(m.main) }

// costModel recomputes the GDSF priorities by brute force.
type costEntry struct {
	prio, cpb float64
	freq      uint32
	epoch     uint32
}

type costModel struct {
	keys          map[uint64]*costEntry
	l             float64
	period, calls uint64
	epoch         uint32
}

func (m *costModel) tick() {
	if m.calls++; m.calls >= m.period {
		m.calls = 0
		m.epoch++
	}
}
func (m *costModel) insert(k uint64, meta Meta) {
	cpb := meta.RecomputeSeconds / float64(meta.Bytes) // the test's metas are valid
	if meta.RecomputeSeconds == 0 {
		cpb = 1 / float64(meta.Bytes)
	}
	if e, ok := m.keys[k]; ok {
		e.cpb = cpb
		m.touch(k)
		return
	}
	m.tick()
	m.keys[k] = &costEntry{prio: m.l + cpb, cpb: cpb, freq: 1, epoch: m.epoch}
}
func (m *costModel) touch(k uint64) {
	e, ok := m.keys[k]
	if !ok {
		return
	}
	m.tick()
	for e.epoch < m.epoch {
		e.freq /= 2
		e.epoch++
	}
	e.freq++
	e.prio = m.l + float64(e.freq)*e.cpb
}
func (m *costModel) remove(k uint64) { delete(m.keys, k) }

// evict takes the evictable key of least priority; every key in use of
// lower priority than it (every one, when none is evictable) counts as just
// used: its priority is set afresh from the new L, without a use.
func (m *costModel) evict(f func(uint64) bool) (uint64, bool) {
	var best uint64
	found := false
	for k, e := range m.keys {
		if (f == nil || f(k)) && (!found || e.prio < m.keys[best].prio) {
			best, found = k, true
		}
	}
	var skipped []uint64
	for k, e := range m.keys {
		if f != nil && !f(k) && (!found || e.prio < m.keys[best].prio) {
			skipped = append(skipped, k)
		}
	}
	if found {
		m.l = max(m.l, m.keys[best].prio)
		delete(m.keys, best)
	}
	for _, k := range skipped {
		e := m.keys[k]
		freq := e.freq
		if d := m.epoch - e.epoch; d < 32 {
			freq >>= d
		} else {
			freq = 0
		}
		e.prio = m.l + float64(max(1, freq))*e.cpb
	}
	return best, found
}
func (m *costModel) len() int { return len(m.keys) }
