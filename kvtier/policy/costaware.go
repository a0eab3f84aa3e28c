package policy

import (
	"math"

	"kvtier.dev/internal/invariants"
)

// CostAware evicts the key whose loss costs least per byte, weighted by how
// often it is reused: a GreedyDual-Size-Frequency policy (Cherkasova 1998)
// with frequencies that decay. Each tracked key k has a priority
//
//	H(k) = L + f(k) * c(k) / s(k)
//
// set when k is inserted or touched, where
//
//   - c(k) is Meta.RecomputeSeconds, the seconds of prefill that losing k costs
//     (a block deep in a long prefix costs more than an early one); zero
//     (unknown), negative, NaN or infinite counts as 1, so a CostAware given
//     no costs is GDSF with uniform cost;
//   - s(k) is Meta.Bytes, the key's size; zero or negative counts as 1;
//   - f(k) is k's use count: 1 at Insert, plus 1 per Touch, halved once per
//     decay period elapsed since k was last used (a period is a fixed number
//     of Insert and Touch calls on the policy), so that a burst of reuse long
//     ago does not protect a key forever;
//   - L is the inflation value: the priority of the last evicted key. It
//     only grows, so a key that is not used again sinks below the newly
//     touched ones and ages out, which plain frequency-over-size would not do.
//
// Evict takes the evictable key with the smallest H. Keys are kept in an
// index-based 4-ary min-heap whose entries hold the priority inline (a
// node's four children share one cache line), over a slab of plain-value
// nodes, with an index from key to node (a map, or a slice for Dense keys:
// NewDenseCostAware): no pointer per key.
//
// CostAware has no locking inside; the caller serialises every call.
type CostAware[K comparable] struct {
	nodes     []costNode[K]
	index     keyIndex[K]
	free      int32       // first free node, linked through pos; -1 when none
	heap      []heapEntry // a 4-ary min-heap on prio
	frontier  []int32     // Evict's scratch: heap positions, a binary min-heap on prio
	skipped   []int32     // Evict's scratch: nodes in use it walked past
	inflation float64     // L
	period    uint64      // Insert and Touch calls per decay period
	calls     uint64      // calls in the current period
	epoch     uint32      // periods elapsed
	checks    sampler
}

type heapEntry struct {
	prio float64 // H
	node int32
}

const arity = 4

type costNode[K comparable] struct {
	key         K
	costPerByte float64 // c/s
	freq        uint32  // f as of epoch
	epoch       uint32  // the period of the key's last use
	pos         int32   // position in heap; next free node when free
}

var _ Policy[uint64] = (*CostAware[uint64])(nil)

// NewCostAware returns an empty CostAware with room for capacity keys before
// its slab grows, whose use counts halve every decayCalls calls of Insert and
// Touch. For example, with decayCalls equal to 4 times the tier's capacity in
// blocks, a block must be used again within about 4 tier turnovers to keep its
// weight. capacity is a hint, not a limit: the caller decides when to Evict.
func NewCostAware[K comparable](capacity, decayCalls int) (*CostAware[K], error) {
	return newCostAware("NewCostAware", capacity, decayCalls, func(n int) keyIndex[K] { return make(mapIndex[K], n) })
}

// NewDenseCostAware is NewCostAware for Dense keys, with a slice instead of a
// map from key to node, as NewDenseLRU.
func NewDenseCostAware[K Dense](capacity, decayCalls int) (*CostAware[K], error) {
	return newCostAware("NewDenseCostAware", capacity, decayCalls, func(n int) keyIndex[K] { return newDenseIndex[K](n) })
}

func newCostAware[K comparable](constructor string, capacity, decayCalls int, index func(capacity int) keyIndex[K]) (*CostAware[K], error) {
	if capacity <= 0 || capacity >= maxNodes {
		return nil, argError(constructor, "capacity", capacity, "1 to 2^31-2 keys")
	}
	if decayCalls <= 0 {
		return nil, argError(constructor, "decayCalls", decayCalls, "> 0 calls")
	}
	return &CostAware[K]{
		nodes:  make([]costNode[K], 0, capacity),
		index:  index(capacity),
		free:   -1,
		heap:   make([]heapEntry, 0, capacity),
		period: uint64(decayCalls),
	}, nil
}

// Insert tracks key with meta's cost and size. Inserting a tracked key
// replaces its cost and size and touches it.
func (p *CostAware[K]) Insert(key K, meta Meta) {
	cpb := costPerByte(meta)
	if i, ok := p.index.get(key); ok {
		p.nodes[i].costPerByte = cpb
		p.use(i)
		p.check()
		return
	}
	p.tick()
	var i int32
	if p.free >= 0 {
		i = p.free
		p.free = p.nodes[i].pos
	} else {
		invariants.Check(len(p.nodes) < maxNodes, "policy: CostAware: more than %d keys", maxNodes)
		p.nodes = append(p.nodes, costNode[K]{})
		i = int32(len(p.nodes) - 1)
	}
	p.nodes[i] = costNode[K]{
		key:         key,
		costPerByte: cpb,
		freq:        1,
		epoch:       p.epoch,
		pos:         int32(len(p.heap)),
	}
	p.index.set(key, i)
	p.heap = append(p.heap, heapEntry{prio: p.inflation + cpb, node: i})
	p.up(len(p.heap) - 1)
	p.check()
}

func costPerByte(meta Meta) float64 {
	c := meta.RecomputeSeconds
	if !(c > 0) || math.IsInf(c, 1) {
		c = 1
	}
	s := float64(meta.Bytes)
	if meta.Bytes <= 0 {
		s = 1
	}
	return c / s
}

// Touch records a use of a tracked key and raises its priority.
func (p *CostAware[K]) Touch(key K) {
	if i, ok := p.index.get(key); ok {
		p.use(i)
		p.check()
	}
}

func (p *CostAware[K]) use(i int32) {
	p.tick()
	n := &p.nodes[i]
	n.freq = decayed(n.freq, p.epoch-n.epoch)
	if n.freq < math.MaxUint32 {
		n.freq++
	}
	n.epoch = p.epoch
	p.heap[n.pos].prio = p.inflation + float64(n.freq)*n.costPerByte
	p.fix(int(n.pos))
}

// decayed halves freq once per elapsed period.
func decayed(freq, periods uint32) uint32 {
	if periods >= 32 {
		return 0
	}
	return freq >> periods
}

// tick counts an Insert or Touch call toward the decay period.
func (p *CostAware[K]) tick() {
	p.calls++
	if p.calls >= p.period {
		p.calls = 0
		p.epoch++
	}
}

// Remove forgets key. L is unchanged: only evictions inflate it.
func (p *CostAware[K]) Remove(key K) {
	if i, ok := p.index.get(key); ok {
		p.drop(i)
		p.check()
	}
}

// Evict removes and returns the evictable key (a nil evictable accepts
// every key) with the smallest priority, and raises L to that priority.
// Keys it skips keep their priority and so their place. It visits keys in
// priority order without changing the heap, so its cost is O(k log k) for k
// in-use keys of lower priority than the victim, plus O(log n) to remove the
// victim; when nothing is evictable it visits every key (ok false).
func (p *CostAware[K]) Evict(evictable func(K) bool) (victim K, ok bool) {
	if len(p.heap) == 0 {
		return victim, false
	}
	pos := 0
	p.skipped = p.skipped[:0]
	if evictable != nil && !evictable(p.nodes[p.heap[0].node].key) {
		pos = p.search(evictable)
	}
	if pos >= 0 {
		e := p.heap[pos]
		victim, ok = p.nodes[e.node].key, true
		p.inflation = max(p.inflation, e.prio)
		p.drop(e.node)
	}
	// A key in use counts as just used (without a use of its count, which
	// counts at least 1): its priority is set afresh from L, so that it
	// sinks below the keys the next Evict will consider instead of being
	// walked past again.
	for _, i := range p.skipped {
		n := &p.nodes[i]
		p.heap[n.pos].prio = p.inflation + float64(max(1, decayed(n.freq, p.epoch-n.epoch)))*n.costPerByte
		p.fix(int(n.pos))
	}
	p.check()
	return victim, ok
}

// search returns the heap position of the evictable key of least priority,
// or -1. It grows a frontier of heap positions from the root, always
// expanding the frontier's least-priority position: the heap property makes
// that the next key in priority order.
func (p *CostAware[K]) search(evictable func(K) bool) int {
	p.frontier = append(p.frontier[:0], 0)
	for len(p.frontier) > 0 {
		pos := p.popFrontier()
		if evictable(p.nodes[p.heap[pos].node].key) {
			return int(pos)
		}
		p.skipped = append(p.skipped, p.heap[pos].node)
		for c := arity*pos + 1; c <= arity*pos+arity && int(c) < len(p.heap); c++ {
			p.pushFrontier(c)
		}
	}
	return -1
}

func (p *CostAware[K]) frontierLess(a, b int) bool {
	return p.heap[p.frontier[a]].prio < p.heap[p.frontier[b]].prio
}

func (p *CostAware[K]) pushFrontier(pos int32) {
	f := append(p.frontier, pos)
	p.frontier = f
	for j := len(f) - 1; j > 0; {
		parent := (j - 1) / 2
		if !p.frontierLess(j, parent) {
			break
		}
		f[j], f[parent] = f[parent], f[j]
		j = parent
	}
}

func (p *CostAware[K]) popFrontier() int32 {
	f := p.frontier
	top := f[0]
	last := len(f) - 1
	f[0] = f[last]
	f = f[:last]
	p.frontier = f
	for j := 0; ; {
		l, r, m := 2*j+1, 2*j+2, j
		if l < len(f) && p.frontierLess(l, m) {
			m = l
		}
		if r < len(f) && p.frontierLess(r, m) {
			m = r
		}
		if m == j {
			return top
		}
		f[j], f[m] = f[m], f[j]
		j = m
	}
}

// drop removes node i from the heap and the index and frees it.
func (p *CostAware[K]) drop(i int32) {
	pos := int(p.nodes[i].pos)
	last := len(p.heap) - 1
	if pos != last {
		p.swap(pos, last)
	}
	p.heap = p.heap[:last]
	if pos != last {
		p.fix(pos)
	}
	p.index.del(p.nodes[i].key)
	p.nodes[i] = costNode[K]{pos: p.free}
	p.free = i
}

// Len is the number of tracked keys.
func (p *CostAware[K]) Len() int { return len(p.heap) }

// Contains reports whether key is tracked, without touching it.
func (p *CostAware[K]) Contains(key K) bool {
	_, ok := p.index.get(key)
	return ok
}

// Inflation is L, the priority of the last evicted key.
func (p *CostAware[K]) Inflation() float64 { return p.inflation }

func (p *CostAware[K]) swap(a, b int) {
	p.heap[a], p.heap[b] = p.heap[b], p.heap[a]
	p.nodes[p.heap[a].node].pos = int32(a)
	p.nodes[p.heap[b].node].pos = int32(b)
}

func (p *CostAware[K]) fix(pos int) {
	if !p.up(pos) {
		p.down(pos)
	}
}

// up moves the entry at pos toward the root while it is smaller than its
// parent, shifting parents down instead of swapping.
func (p *CostAware[K]) up(pos int) (moved bool) {
	e := p.heap[pos]
	for pos > 0 {
		parent := (pos - 1) / arity
		if !(e.prio < p.heap[parent].prio) {
			break
		}
		p.heap[pos] = p.heap[parent]
		p.nodes[p.heap[pos].node].pos = int32(pos)
		pos = parent
		moved = true
	}
	p.heap[pos] = e
	p.nodes[e.node].pos = int32(pos)
	return moved
}

// down moves the entry at pos toward the leaves while a child is smaller.
func (p *CostAware[K]) down(pos int) {
	e := p.heap[pos]
	n := len(p.heap)
	for {
		first := arity*pos + 1
		if first >= n {
			break
		}
		m := first
		for c := first + 1; c < first+arity && c < n; c++ {
			if p.heap[c].prio < p.heap[m].prio {
				m = c
			}
		}
		if !(p.heap[m].prio < e.prio) {
			break
		}
		p.heap[pos] = p.heap[m]
		p.nodes[p.heap[pos].node].pos = int32(pos)
		pos = m
	}
	p.heap[pos] = e
	p.nodes[e.node].pos = int32(pos)
}

func (p *CostAware[K]) check() {
	if !p.checks.due(p.Len()) {
		return
	}
	invariants.Check(p.index.len() == len(p.heap), "policy: CostAware: %d keys indexed, %d in heap", p.index.len(), len(p.heap))
	for pos, e := range p.heap {
		i := e.node
		n := &p.nodes[i]
		invariants.Check(int(n.pos) == pos, "policy: CostAware: node %d at heap position %d says %d", i, pos, n.pos)
		j, ok := p.index.get(n.key)
		invariants.Check(ok && j == i, "policy: CostAware: node %d is not indexed under its key", i)
		if pos > 0 {
			invariants.Check(p.heap[(pos-1)/arity].prio <= e.prio, "policy: CostAware: heap order broken at position %d", pos)
		}
		invariants.Check(e.prio >= 0 && !math.IsNaN(e.prio), "policy: CostAware: node %d priority %v", i, e.prio)
	}
	free := 0
	for i := p.free; i >= 0; i = p.nodes[i].pos {
		free++
		invariants.Check(free <= len(p.nodes), "policy: CostAware: free list has a cycle")
	}
	invariants.Check(free+len(p.heap) == len(p.nodes), "policy: CostAware: %d free + %d used != %d nodes", free, len(p.heap), len(p.nodes))
}
