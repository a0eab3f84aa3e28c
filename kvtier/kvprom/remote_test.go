package kvprom

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvtier.dev/internal/stacktest"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/remote"
	"kvtier.dev/kvtier/remotetier"
)

// TestRemoteCollectors: one cache publishes a block to a remote tier held
// in memory, another fetches it, and the second's collectors report the
// hit, the fetch, and nothing else; the first's the write.
func TestRemoteCollectors(t *testing.T) {
	st := &mapStore{m: map[string][]byte{}}
	tier := func() (*stacktest.Stack, *remotetier.Tier) {
		s := stacktest.Open(t, stacktest.Options{BlockTokens: 2, WriteThrough: true})
		c, err := remote.New(remote.Config{Store: st, BlockBytes: stacktest.BlockBytes})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		rt, err := remotetier.New(s.Manager, remotetier.Config{Cache: c, Admitter: policy.AlwaysAdmit[kvtier.Key]{},
			HostSlot: func(sl kvtier.Slot) []byte { return s.Host.Slot(int32(sl)) }})
		if err != nil {
			t.Fatal(err)
		}
		return s, rt
	}
	a, art := tier()
	b, brt := tier()
	tokens := []int32{1, 2}
	var w, l, bl kvtier.Lease
	if err := a.Insert(1, tokens, kvtier.GPU, &w); err != nil {
		t.Fatal(err)
	}
	if err := a.Commit(&w, nil); err != nil {
		t.Fatal(err)
	}
	a.Release(&w)
	if err := a.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := a.Lookup(1, tokens, &l); err != nil {
		t.Fatal(err)
	}
	if n, err := art.Publish(1, tokens, &l); n != 1 || err != nil {
		t.Fatalf("published %d, %v", n, err)
	}
	a.Release(&l)
	if err := art.Cache().Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.Lookup(1, tokens, &bl); err != nil {
		t.Fatal(err)
	}
	if n, err := brt.Fetch(context.Background(), 1, tokens, &bl); n != 1 || err != nil {
		t.Fatalf("fetched %d, %v", n, err)
	}
	b.Release(&bl)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(Remote(brt, "kvserve", prometheus.Labels{"model": "test"})...)
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 20 {
		t.Fatalf("%d series, %v; want 6 read results, 7 write results, 2 byte counts, 2 of the breaker, 3 of the tier", n, err)
	}
	want := `
# HELP kvserve_remote_fetched_blocks_total Blocks fetched from the remote tier into the host tier.
# TYPE kvserve_remote_fetched_blocks_total counter
kvserve_remote_fetched_blocks_total{model="test"} 1
# HELP kvserve_remote_breaker_open 1 while the remote tier's circuit breaker is open or probing (reads miss at once, writes are dropped), else 0.
# TYPE kvserve_remote_breaker_open gauge
kvserve_remote_breaker_open{model="test"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvserve_remote_fetched_blocks_total", "kvserve_remote_breaker_open"); err != nil {
		t.Error(err)
	}
	got := map[string]float64{}
	for _, c := range Remote(brt, "kvserve", nil)[:6] {
		got[desc(c)] = testutil.ToFloat64(c)
	}
	if got[`result="hit"`] != 1 || got[`result="corrupt"`] != 0 {
		t.Errorf("b's reads: %v, want one hit", got)
	}
	if w := testutil.ToFloat64(Remote(art, "kvserve", nil)[6]); w != 1 {
		t.Errorf("a's written blocks: %v, want 1", w)
	}
}

// desc is a collector's const label, as its description shows it.
func desc(c prometheus.Collector) string {
	ch := make(chan *prometheus.Desc, 1)
	c.Describe(ch)
	s := (<-ch).String()
	if i := strings.Index(s, "constLabels: {"); i >= 0 {
		s = s[i+len("constLabels: {"):]
		return s[:strings.Index(s, "}")]
	}
	return s
}

// mapStore is a remote.Store in a map.
type mapStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *mapStore) Get(_ context.Context, ops []remote.GetOp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range ops {
		for k, key := range ops[i].Keys {
			v, ok := s.m[key]
			ops[i].Got[k] = -1
			if ok {
				ops[i].Got[k] = len(v)
				copy(ops[i].Dst[k], v)
			}
		}
	}
}

func (s *mapStore) Put(_ context.Context, ops []remote.PutOp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range ops {
		for k, key := range ops[i].Keys {
			s.m[key] = bytes.Clone(ops[i].Values[k])
		}
	}
}

func (s *mapStore) Exists(_ context.Context, keys []string, found []bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range keys {
		_, found[i] = s.m[k]
	}
	return nil
}

func (s *mapStore) Delete(_ context.Context, keys []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		delete(s.m, k)
	}
	return nil
}

func (s *mapStore) Close() error { return nil }
