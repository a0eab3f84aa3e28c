package kvtier

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"math"
	"os"
	"testing"
)

// mooncakeTrace is the Mooncake synthetic trace committed with the trace
// package, so these tests run in a clean clone.
const mooncakeTrace = "trace/testdata/mooncake_synthetic_trace.jsonl.gz"

// readMooncake parses the hash_ids of each request (the trace package is not
// a dependency of the block manager).
func readMooncake(t testing.TB) [][]Key {
	t.Helper()
	f, err := os.Open(mooncakeTrace)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", mooncakeTrace, err)
	}
	var reqs [][]Key
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		var r struct {
			HashIDs []uint64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s:%d: %v", mooncakeTrace, line, err)
		}
		keys := make([]Key, len(r.HashIDs))
		for i, id := range r.HashIDs {
			keys[i] = Key(id)
		}
		reqs = append(reqs, keys)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return reqs
}

// replayPrefixLRU replays reqs through one tier of capacity blocks: each
// request reuses the leading run of its blocks that is cached (LookupKeys),
// then inserts or touches all of its blocks in order (InsertKeys).
func replayPrefixLRU(t testing.TB, reqs [][]Key, capacity int) (hitRatio float64, m *Manager) {
	m = oneTier(t, Host, capacity, 512)
	var l Lease
	hits, total := 0, 0
	for i, keys := range reqs {
		if err := m.LookupKeys(0, keys, &l); err != nil {
			t.Fatal(err)
		}
		hits += l.Len()
		total += len(keys)
		m.Release(&l)
		if err := m.InsertKeys(0, keys, Host, &l); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if err := m.Commit(&l, nil); err != nil {
			t.Fatal(err)
		}
		m.Release(&l)
	}
	return float64(hits) / float64(total), m
}

func TestReplayMooncakePrefixLRU(t *testing.T) {
	reqs := readMooncake(t)
	for _, c := range []struct {
		blocks int
		want   float64
	}{{439, 0.0343}, {4392, 0.2598}, {21962, 0.5888}} {
		got, m := replayPrefixLRU(t, reqs, c.blocks)
		mt := m.Metrics()
		t.Logf("capacity %d blocks: hit ratio %.4f (reference %.4f), %d evictions, %d mismatches",
			c.blocks, got, c.want, mt.Tiers[Host].Evictions, mt.Mismatches)
		if math.Abs(got-c.want) > 0.002 {
			t.Errorf("capacity %d blocks: hit ratio %.4f, reference %.4f", c.blocks, got, c.want)
		}
		if mt.Mismatches != 0 || mt.Tiers[Host].ResidentBlocks != int64(c.blocks) {
			t.Errorf("capacity %d: %d mismatches, %d resident", c.blocks, mt.Mismatches, mt.Tiers[Host].ResidentBlocks)
		}
		if got, want := float64(mt.HitBlocks)/float64(mt.LookupBlocks), got; got != want {
			t.Errorf("metrics hit ratio %.4f, replay %.4f", got, want)
		}
		m.check(t)
	}
}
