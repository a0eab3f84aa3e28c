package policy

import (
	"math"

	"kvtier.dev/internal/invariants"
)

// maxNodes bounds a slab so that node indices fit in an int32.
const maxNodes = math.MaxInt32

// node is one key's state in a queueSlab. It holds no pointer unless K does,
// so a slab of tens of millions of nodes is a single object the garbage
// collector need not scan.
type node[K comparable] struct {
	key        K
	prev, next int32 // neighbours on the node's queue; a free node's next links the free list
	queue      uint8 // which queue the node is on
	freq       uint8 // access counter for the policies that keep one
}

// queueSlab holds up to maxQueues circular doubly linked queues whose nodes
// live in one slice and are addressed by int32 index, plus an index from key
// to node (a map, or a slice for Dense keys: see keyIndex). Node
// i < numQueues is queue i's sentinel: its next is the queue's front (most
// recently pushed), its prev the queue's back (the oldest).
//
// LRU, TwoQ and S3FIFO are built on it: a key moves between queues (for
// example from a FIFO to its ghost) without allocating, and a freed node is
// reused through the free list.
type queueSlab[K comparable] struct {
	nodes     []node[K]
	index     keyIndex[K]
	free      int32 // first free node, or -1
	numQueues int
	lens      [maxQueues]int
}

const maxQueues = 3

// newQueueSlab returns a slab of numQueues empty queues with room for
// capacity nodes, indexed by index.
func newQueueSlab[K comparable](numQueues, capacity int, index keyIndex[K]) queueSlab[K] {
	s := queueSlab[K]{
		nodes:     make([]node[K], numQueues, numQueues+capacity),
		index:     index,
		free:      -1,
		numQueues: numQueues,
	}
	for q := range numQueues {
		s.nodes[q].prev, s.nodes[q].next = int32(q), int32(q)
		s.nodes[q].queue = uint8(q)
	}
	return s
}

// lookup returns key's node and whether the key is in the slab (on any queue).
func (s *queueSlab[K]) lookup(key K) (int32, bool) {
	return s.index.get(key)
}

// add allocates a node for key, which MUST NOT be in the slab, and pushes it
// to the front of queue q.
func (s *queueSlab[K]) add(q uint8, key K) int32 {
	var i int32
	if s.free >= 0 {
		i = s.free
		s.free = s.nodes[i].next
	} else {
		if len(s.nodes) >= maxNodes {
			invariants.Check(false, "policy: more than %d keys", maxNodes-maxQueues)
		}
		s.nodes = append(s.nodes, node[K]{})
		i = int32(len(s.nodes) - 1)
	}
	s.nodes[i] = node[K]{key: key}
	s.index.set(key, i)
	s.link(q, i)
	return i
}

// del unlinks node i, forgets its key and puts the node on the free list.
func (s *queueSlab[K]) del(i int32) {
	s.unlink(i)
	s.index.del(s.nodes[i].key)
	s.nodes[i] = node[K]{next: s.free} // drop the key so a K holding pointers is not kept alive
	s.free = i
}

// moveToFront moves node i to the front of queue q (its own or another).
func (s *queueSlab[K]) moveToFront(q uint8, i int32) {
	s.unlink(i)
	s.link(q, i)
}

// back is the oldest node of queue q, or q itself (the sentinel) when empty.
func (s *queueSlab[K]) back(q uint8) int32 { return s.nodes[q].prev }

// isSentinel reports whether i is a queue's sentinel, the end of a walk.
func (s *queueSlab[K]) isSentinel(i int32) bool { return int(i) < s.numQueues }

func (s *queueSlab[K]) link(q uint8, i int32) {
	head := int32(q)
	first := s.nodes[head].next
	n := &s.nodes[i]
	n.prev, n.next, n.queue = head, first, q
	s.nodes[first].prev = i
	s.nodes[head].next = i
	s.lens[q]++
}

func (s *queueSlab[K]) unlink(i int32) {
	n := &s.nodes[i]
	s.nodes[n.prev].next = n.next
	s.nodes[n.next].prev = n.prev
	s.lens[n.queue]--
	n.prev, n.next = -1, -1
}

// check verifies the slab's structure: every queue is a consistent cycle
// whose length matches lens, every linked node is indexed under its key, and
// the free list and queues together account for every node.
func (s *queueSlab[K]) check() {
	linked := 0
	for q := range s.numQueues {
		n := 0
		for i := s.nodes[q].next; i != int32(q); i = s.nodes[i].next {
			nd := &s.nodes[i]
			invariants.Check(s.nodes[nd.next].prev == i, "policy: node %d: next's prev is not the node", i)
			invariants.Check(int(nd.queue) == q, "policy: node %d on queue %d says queue %d", i, q, nd.queue)
			j, ok := s.index.get(nd.key)
			invariants.Check(ok && j == i, "policy: node %d on queue %d is not indexed under its key", i, q)
			n++
			invariants.Check(n <= len(s.nodes), "policy: queue %d has a cycle", q)
		}
		invariants.Check(n == s.lens[q], "policy: queue %d holds %d nodes, lens says %d", q, n, s.lens[q])
		linked += n
	}
	invariants.Check(linked == s.index.len(), "policy: %d nodes linked, %d keys indexed", linked, s.index.len())
	free := 0
	for i := s.free; i >= 0; i = s.nodes[i].next {
		free++
		invariants.Check(free <= len(s.nodes), "policy: free list has a cycle")
	}
	invariants.Check(s.numQueues+linked+free == len(s.nodes),
		"policy: %d sentinels + %d linked + %d free != %d nodes", s.numQueues, linked, free, len(s.nodes))
}
