package policy

import (
	"bufio"
	"compress/gzip"
	"container/heap"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
)

// tracePath is the Mooncake synthetic trace committed with the trace
// package, so these tests run in a clean clone.
const tracePath = "../trace/testdata/mooncake_synthetic_trace.jsonl.gz"

// traceRequests is the hash_ids of each request of the Mooncake synthetic
// trace, parsed once. The parser is local to this test on purpose: the trace
// package belongs to another part of kvtier, and a policy test needs only
// the block ids.
var traceRequests = sync.OnceValues(func() ([][]uint64, error) {
	f, err := os.Open(tracePath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tracePath, err)
	}
	var reqs [][]uint64
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		var r struct {
			HashIDs []uint64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", tracePath, line, err)
		}
		if len(r.HashIDs) == 0 {
			return nil, fmt.Errorf("%s:%d: no hash_ids", tracePath, line)
		}
		reqs = append(reqs, r.HashIDs)
	}
	return reqs, sc.Err()
})

func loadTrace(t testing.TB) [][]uint64 {
	t.Helper()
	reqs, err := traceRequests()
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

func flatten(reqs [][]uint64) []uint64 {
	var seq []uint64
	for _, r := range reqs {
		seq = append(seq, r...)
	}
	return seq
}

// belady is the hit ratio of Belady's MIN on seq with room for capacity keys:
// on a miss with the cache full it drops, among the resident keys and the
// missed key itself, the one whose next use is farthest (a key never used
// again first). No policy that sees only the past can do better.
func belady(seq []uint64, capacity int) float64 {
	next := make([]int, len(seq))
	last := map[uint64]int{}
	for i := len(seq) - 1; i >= 0; i-- {
		if j, ok := last[seq[i]]; ok {
			next[i] = j
		} else {
			next[i] = math.MaxInt
		}
		last[seq[i]] = i
	}
	resident := map[uint64]int{} // key -> its next use
	h := &nextUseHeap{}
	hits := 0
	for i, k := range seq {
		if _, ok := resident[k]; ok {
			hits++
			resident[k] = next[i]
			heap.Push(h, nextUse{k, next[i]})
			continue
		}
		if len(resident) >= capacity {
			// Drop stale heap entries, then compare the farthest resident with k.
			for {
				top := (*h)[0]
				if resident[top.key] == top.next {
					break
				}
				heap.Pop(h)
			}
			if (*h)[0].next <= next[i] {
				continue // k itself is used farthest in the future: bypass it
			}
			delete(resident, heap.Pop(h).(nextUse).key)
		}
		resident[k] = next[i]
		heap.Push(h, nextUse{k, next[i]})
	}
	return float64(hits) / float64(len(seq))
}

type nextUse struct {
	key  uint64
	next int
}

// nextUseHeap is a max-heap on next use.
type nextUseHeap []nextUse

func (h nextUseHeap) Len() int           { return len(h) }
func (h nextUseHeap) Less(i, j int) bool { return h[i].next > h[j].next }
func (h nextUseHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *nextUseHeap) Push(x any)        { *h = append(*h, x.(nextUse)) }
func (h *nextUseHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// tracker is what the replays need beyond Policy.
type tracker interface {
	Policy[uint64]
	Contains(uint64) bool
}

// replayFlat is the hit ratio of p on seq, a single tier of capacity keys:
// a hit touches the key, a miss evicts when full and inserts.
func replayFlat(p tracker, seq []uint64, capacity int) float64 {
	hits := 0
	for _, k := range seq {
		if p.Contains(k) {
			hits++
			p.Touch(k)
			continue
		}
		if p.Len() >= capacity {
			p.Evict(nil)
		}
		p.Insert(k, Meta{Bytes: 1})
	}
	return float64(hits) / float64(len(seq))
}

// replayPrefix is the prefix-aware replay of traces/README.md: a request
// hits the leading run of its blocks that are cached; then all its blocks
// are inserted or touched, in order. cost(j, n) is block j's RecomputeSeconds
// in a request of n blocks, which only CostAware reads.
func replayPrefix(p tracker, reqs [][]uint64, capacity int, cost blockCost) float64 {
	hits, total := 0, 0
	for _, r := range reqs {
		total += len(r)
		for _, k := range r {
			if !p.Contains(k) {
				break
			}
			hits++
		}
		for j, k := range r {
			if p.Contains(k) {
				p.Touch(k)
				continue
			}
			if p.Len() >= capacity {
				p.Evict(nil)
			}
			p.Insert(k, Meta{Bytes: 1, RecomputeSeconds: cost(j, len(r))})
		}
	}
	return float64(hits) / float64(total)
}

// blockCost gives block j of an n-block request its RecomputeSeconds.
type blockCost func(j, n int) float64

var (
	// uniformCost: cost unknown.
	uniformCost blockCost = func(j, n int) float64 { return 0 }
	// depthCost: prefilling block j attends over j+1 blocks, so it costs
	// about j+1 units. This is Meta's "a block deep in a long prefix costs
	// more to recompute".
	depthCost blockCost = func(j, n int) float64 { return float64(j + 1) }
	// strandedCost: when block j is lost, a prefix-aware server also
	// cannot use blocks j+1..n-1 of this request even if they are cached,
	// so losing block j costs the prefill of blocks j..n-1.
	strandedCost blockCost = func(j, n int) float64 {
		return float64(n*(n+1)/2 - j*(j+1)/2)
	}
)

type namedPolicy struct {
	name string
	make func(capacity int) (tracker, error)
}

var tracePolicies = []namedPolicy{
	{"LRU", func(c int) (tracker, error) { return NewLRU[uint64](c) }},
	{"TwoQ", func(c int) (tracker, error) { return NewTwoQ[uint64](c) }},
	{"S3FIFO", func(c int) (tracker, error) { return NewS3FIFO[uint64](c) }},
	{"CostAware", func(c int) (tracker, error) { return NewCostAware[uint64](c, 4*c) }},
}

// TestPrefixLRUReference checks the LRU, with a map index and with a dense
// index (the trace's block ids are dense), against the independent
// simulator's figures in traces/README.md.
func TestPrefixLRUReference(t *testing.T) {
	reqs := loadTrace(t)
	for _, tc := range []struct {
		blocks int
		want   float64
	}{{439, 0.0343}, {4392, 0.2598}, {21962, 0.5888}} {
		for _, np := range []namedPolicy{tracePolicies[0], densePolicies[0]} {
			p, err := np.make(tc.blocks)
			if err != nil {
				t.Fatal(err)
			}
			got := replayPrefix(p, reqs, tc.blocks, uniformCost)
			t.Logf("prefix-aware %s, %d blocks: %.4f (reference %.4f)", np.name, tc.blocks, got, tc.want)
			if math.Abs(got-tc.want) > 0.002 {
				t.Errorf("prefix-aware %s, %d blocks: hit ratio %.4f, reference %.4f", np.name, tc.blocks, got, tc.want)
			}
		}
	}
}

// TestTraceAgainstBelady replays the trace's block sequence through every
// policy at 1%, 10% and 50% of its unique blocks: no policy may beat
// Belady's MIN, and each must reach a sane share of it. It logs a table of
// hit ratios, flat and prefix-aware.
func TestTraceAgainstBelady(t *testing.T) {
	reqs := loadTrace(t)
	seq := flatten(reqs)
	unique := map[uint64]struct{}{}
	for _, k := range seq {
		unique[k] = struct{}{}
	}
	if len(seq) != 121877 || len(unique) != 43924 {
		t.Fatalf("trace has %d references, %d unique; README says 121877, 43924", len(seq), len(unique))
	}
	var table strings.Builder
	fmt.Fprintf(&table, "\n%-10s %8s %16s %8s %8s\n", "capacity", "blocks", "policy", "flat", "prefix")
	for _, frac := range []float64{0.01, 0.10, 0.50} {
		capacity := int(frac * float64(len(unique)))
		opt := belady(seq, capacity)
		lru := 0.0
		fmt.Fprintf(&table, "%-10s %8d %16s %8.4f %8s\n", fmt.Sprintf("%.0f%%", frac*100), capacity, "Belady", opt, "-")
		for _, np := range tracePolicies {
			p, err := np.make(capacity)
			if err != nil {
				t.Fatal(err)
			}
			flat := replayFlat(p, seq, capacity)
			p, _ = np.make(capacity)
			prefix := replayPrefix(p, reqs, capacity, uniformCost)
			fmt.Fprintf(&table, "%-10s %8d %16s %8.4f %8.4f\n", "", capacity, np.name, flat, prefix)
			if flat > opt+1e-12 {
				t.Errorf("%s at %d blocks: hit ratio %.4f beats Belady's %.4f", np.name, capacity, flat, opt)
			}
			if flat < 0.15*opt || flat < 0.85*lru {
				t.Errorf("%s at %d blocks: hit ratio %.4f, want at least 0.15 x Belady (%.4f) and 0.85 x LRU (%.4f)",
					np.name, capacity, flat, opt, lru)
			}
			if np.name == "LRU" {
				lru = flat
			}
		}
		// CostAware on the prefix-aware replay, fed each kind of cost.
		for _, c := range []struct {
			name string
			cost blockCost
		}{{"CostAware/depth", depthCost}, {"CostAware/strand", strandedCost}} {
			p, err := NewCostAware[uint64](capacity, 4*capacity)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&table, "%-10s %8d %16s %8s %8.4f\n", "", capacity, c.name, "-", replayPrefix(p, reqs, capacity, c.cost))
		}
	}
	t.Log(table.String())
}
