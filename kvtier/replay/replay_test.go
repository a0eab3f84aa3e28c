package replay

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"kvtier.dev/internal/invariants"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/trace"
)

// mooncake is the public Mooncake synthetic trace, kept (gzip-compressed,
// with its attribution) in kvtier/trace's testdata.
var mooncake = FileSource("../trace/testdata/mooncake_synthetic_trace.jsonl.gz")

// quick is set under the invariants build tag, where the block manager
// checks its whole state on almost every operation: the tests then replay
// the first requests of the bundled trace, and the figure tests, which need
// whole traces, are left to the plain `go test ./kvtier/replay` (about 5 s).
const quick = invariants.Enabled

// quickRequests is how many requests of the bundled trace the tests replay
// in quick mode.
const quickRequests = 200

// bundled is the bundled trace, or its first requests in quick mode.
func bundled() (Source, int64) {
	if quick {
		return firstLines(BundledSource(), quickRequests), quickRequests
	}
	return BundledSource(), 3000
}

// testConfig is DefaultConfig, with small tiers in quick mode (the block
// manager's invariant checks walk every block it knows).
func testConfig() Config {
	cfg := DefaultConfig()
	if quick {
		cfg.GPUBytes, cfg.HostBytes, cfg.NVMeBytes = 16<<30, 16<<30, 64<<30
	}
	return cfg
}

// firstLines is src cut to its first n lines.
func firstLines(src Source, n int) Source {
	open := src.Open
	src.Open = func() (io.ReadCloser, error) {
		rc, err := open()
		if err != nil {
			return nil, err
		}
		var b strings.Builder
		sc := bufio.NewScanner(rc)
		sc.Buffer(nil, 1<<20)
		for i := 0; i < n && sc.Scan(); i++ {
			b.Write(sc.Bytes())
			b.WriteByte('\n')
		}
		rc.Close()
		return io.NopCloser(strings.NewReader(b.String())), sc.Err()
	}
	return src
}

// defaultBlockBytes is a block of 512 tokens of DefaultConfig's model.
func defaultBlockBytes(t testing.TB) int64 {
	m, err := cost.LookupModel(DefaultConfig().Model)
	if err != nil {
		t.Fatal(err)
	}
	return m.KVBytesPerBlock(512)
}

func runOrFail(t testing.TB, src Source, cfg Config) *Report {
	t.Helper()
	rep, err := Run(src, cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func result(t testing.TB, rep *Report, s costplan.Strategy) *StrategyResult {
	t.Helper()
	for i := range rep.Results {
		if rep.Results[i].Strategy == s.String() {
			return &rep.Results[i]
		}
	}
	t.Fatalf("no result for %v", s)
	return nil
}

// TestReferenceLRUThroughEngine: a single GPU tier with LRU, through the
// whole engine (block manager, admission, virtual clock), reproduces the
// reference simulator's hit ratios on the Mooncake trace.
func TestReferenceLRUThroughEngine(t *testing.T) {
	bb := defaultBlockBytes(t)
	for _, c := range []struct {
		blocks int64
		want   float64
	}{{439, 0.0343}, {4392, 0.2598}, {21962, 0.5888}} {
		cfg := DefaultConfig()
		cfg.GPUBytes, cfg.HostBytes, cfg.NVMeBytes = Bytes(c.blocks*bb), 0, 0
		// The reference counts blocks, not bytes: a GPU of 8 TiB holds
		// the largest of these caches beside the weights.
		cfg.GPUMemoryBytes = 8 << 40
		cfg.Strategy, cfg.Baselines = "gpu-only", false
		cfg.DecodeTokenTime = 0
		res := runOrFail(t, mooncake, cfg).Results[0]
		got := res.HitRatio.Overall
		t.Logf("%d blocks: hit ratio %.4f (reference %.4f)", c.blocks, got, c.want)
		if math.Abs(got-c.want) > 0.002 {
			t.Errorf("%d blocks: hit ratio %.4f, reference %.4f", c.blocks, got, c.want)
		}
		if res.CapacityBlocks.GPU != c.blocks || res.Blocks != 121877 || res.Requests != 3993 {
			t.Errorf("capacity %d blocks, %d block references, %d requests", res.CapacityBlocks.GPU, res.Blocks, res.Requests)
		}
	}
}

// TestReferenceLRUOracle checks the reference figures with an independent,
// plain prefix-aware LRU over the trace reader, as the traces' README
// defines it: the test of the reader's output, apart from the engine.
func TestReferenceLRUOracle(t *testing.T) {
	for _, c := range []struct {
		blocks int
		want   float64
	}{{439, 0.0343}, {2196, 0.1548}, {4392, 0.2598}, {21962, 0.5888}} {
		rc, err := mooncake.Open()
		if err != nil {
			t.Fatal(err)
		}
		got := oracleLRU(t, trace.NewReader(rc, trace.Options{}), c.blocks)
		rc.Close()
		if math.Abs(got-c.want) > 0.002 {
			t.Errorf("%d blocks: oracle hit ratio %.4f, reference %.4f", c.blocks, got, c.want)
		}
	}
}

// oracleLRU is a map and a doubly linked list: a request reuses the
// leading run of its blocks that is cached; then all of its blocks are
// inserted or touched, in order.
func oracleLRU(t testing.TB, r *trace.Reader, capacity int) float64 {
	type node struct {
		key        uint64
		prev, next *node
	}
	head := &node{}
	head.prev, head.next = head, head
	index := map[uint64]*node{}
	unlink := func(n *node) { n.prev.next, n.next.prev = n.next, n.prev }
	front := func(n *node) { n.next, n.prev = head.next, head; head.next.prev = n; head.next = n }
	var req trace.Request
	hits, total := 0, 0
	for {
		err := r.Next(&req)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range req.Keys {
			if index[k] == nil {
				break
			}
			hits++
		}
		total += len(req.Keys)
		for _, k := range req.Keys {
			if n := index[k]; n != nil {
				unlink(n)
				front(n)
				continue
			}
			if len(index) == capacity {
				victim := head.prev
				unlink(victim)
				delete(index, victim.key)
			}
			n := &node{key: k}
			index[k] = n
			front(n)
		}
	}
	return float64(hits) / float64(total)
}

// TestCostPlanBeatsBaselines: with host and NVMe tiers, the cost model's
// plan gives a TTFT mean, p50 and p90 each within 1% of (or below) always
// reloading's and always recomputing's, and beats each on its mean, on the
// bundled trace (default configuration), on a generated long-context
// agentic trace (64-token blocks, sessions past 100K tokens, 70B at tp 8),
// each with one prefill slot and with a GPU per request, and on the
// Mooncake trace (70B at tp 8). On the agentic trace a request loads a
// few blocks behind a long head on the GPU and computes a long tail, so
// its pass hides its loads and the plan's TTFT is reload's (it beat
// reload's mean by 0.0004 s of 26.7 s under the block model).
func TestCostPlanBeatsBaselines(t *testing.T) {
	if quick {
		t.Skip("whole-trace figures: run without the invariants tag")
	}
	agentic := trace.AgenticGenConfig()
	agentic.Requests = 400
	agenticSrc := GeneratedSource("generated:agentic-400", agentic)
	agenticCfg := func(slots int) func(*Config) {
		return func(c *Config) {
			c.Model, c.TP, c.GPUBytes, c.PrefillSlots = "llama-3.1-70b", 8, 12<<30, slots
		}
	}
	cases := []struct {
		name     string
		src      Source
		edit     func(*Config)
		isReload bool // the plan's TTFT is reload's
	}{
		{"bundled", BundledSource(), func(*Config) {}, false},
		{"bundled, prefill slots 0", BundledSource(), func(c *Config) { c.PrefillSlots = 0 }, false},
		{"bundled, 64GiB host", BundledSource(), func(c *Config) { c.HostBytes = 64 << 30 }, false},
		{"agentic", agenticSrc, agenticCfg(1), true},
		{"agentic, prefill slots 0", agenticSrc, agenticCfg(0), true},
		{"mooncake, 70b tp 8", mooncake, func(c *Config) { c.Model, c.TP = "llama-3.1-70b", 8 }, false},
	}
	for _, c := range cases {
		cfg := DefaultConfig()
		c.edit(&cfg)
		rep := runOrFail(t, c.src, cfg)
		costRes := result(t, rep, costplan.Cost)
		for _, s := range []costplan.Strategy{costplan.Reload, costplan.Recompute} {
			base := result(t, rep, s)
			t.Logf("%s: cost mean %.4f s p50 %.4f s p90 %.4f s; %v mean %.4f s p50 %.4f s p90 %.4f s", c.name,
				costRes.TTFT.Mean, costRes.TTFT.P50, costRes.TTFT.P90, s, base.TTFT.Mean, base.TTFT.P50, base.TTFT.P90)
			beats := costRes.TTFT.Mean < base.TTFT.Mean || (c.isReload && s == costplan.Reload && costRes.TTFT.Mean == base.TTFT.Mean)
			if costRes.TTFT.Mean > base.TTFT.Mean*1.01 || costRes.TTFT.P50 > base.TTFT.P50*1.01 || costRes.TTFT.P90 > base.TTFT.P90*1.01 || !beats {
				t.Errorf("%s: cost plan TTFT mean %.4f s, p50 %.4f s, p90 %.4f s; %v mean %.4f s, p50 %.4f s, p90 %.4f s",
					c.name, costRes.TTFT.Mean, costRes.TTFT.P50, costRes.TTFT.P90, s, base.TTFT.Mean, base.TTFT.P50, base.TTFT.P90)
			}
		}
		if strings.HasPrefix(c.name, "bundled") {
			for _, r := range rep.Results {
				if r.DroppedOffloads != 0 {
					t.Errorf("%s: %s dropped %d offloads for lack of queue room", c.name, r.Strategy, r.DroppedOffloads)
				}
			}
		}
		if costRes.Loads.Blocks == 0 || (costRes.Recomputes.Blocks == 0 && !c.isReload) {
			t.Errorf("%s: the cost plan loaded %d and recomputed %d cached blocks; want both", c.name,
				costRes.Loads.Blocks, costRes.Recomputes.Blocks)
		}
	}
}

// TestAccounting: every block reference is used, loaded, recomputed or a
// miss; hits by tier add up; bytes moved match copies; every strategy sees
// the same trace.
func TestAccounting(t *testing.T) {
	cfg := testConfig()
	cfg.HostBytes = min(cfg.HostBytes, 64<<30)
	src, n := bundled()
	rep := runOrFail(t, src, cfg)
	if len(rep.Results) != int(costplan.NumStrategies) || rep.Results[0].Strategy != "cost" {
		t.Fatalf("%d results, first %q", len(rep.Results), rep.Results[0].Strategy)
	}
	for i := range rep.Results {
		s := &rep.Results[i]
		if s.Requests != n || s.Blocks != rep.Results[0].Blocks {
			t.Errorf("%s: %d requests, %d blocks", s.Strategy, s.Requests, s.Blocks)
		}
		if sum := s.UsedBlocks + s.Loads.Blocks + s.Recomputes.Blocks + s.MissBlocks; sum != s.Blocks {
			t.Errorf("%s: used %d + loaded %d + recomputed %d + missed %d = %d, want %d blocks", s.Strategy,
				s.UsedBlocks, s.Loads.Blocks, s.Recomputes.Blocks, s.MissBlocks, sum, s.Blocks)
		}
		hit := s.HitRatio.GPU + s.HitRatio.Host + s.HitRatio.NVMe
		if math.Abs(hit-s.HitRatio.Overall) > 1e-9 || math.Abs(s.HitRatio.Overall-ratio(s.Blocks-s.MissBlocks, s.Blocks)) > 1e-9 {
			t.Errorf("%s: hit ratios %+v do not add up (misses %d)", s.Strategy, s.HitRatio, s.MissBlocks)
		}
		if s.Loads.Blocks != s.Loads.FromHost+s.Loads.FromNVMe || s.moved("host", "gpu")+s.moved("nvme", "gpu") != s.Loads.Blocks*rep.BlockBytes {
			t.Errorf("%s: loads %+v, moved into the GPU %d bytes", s.Strategy, s.Loads, s.moved("host", "gpu")+s.moved("nvme", "gpu"))
		}
		if s.TTFT.P50 > s.TTFT.P90 || s.TTFT.P90 > s.TTFT.P99 || s.TTFT.P99 > s.TTFT.Max || s.TTFT.P50 <= 0 {
			t.Errorf("%s: TTFT %+v", s.Strategy, s.TTFT)
		}
	}
	none, gpuOnly := result(t, rep, costplan.None), result(t, rep, costplan.GPUOnly)
	switch {
	case none.HitRatio.Overall != 0 || none.TokensReused != 0:
		t.Errorf("no prefix cache reused %d tokens", none.TokensReused)
	case gpuOnly.HitRatio.Host != 0 || gpuOnly.HitRatio.NVMe != 0 || len(gpuOnly.Moves) != 0:
		t.Errorf("GPU-only used lower tiers: %+v, %d moves", gpuOnly.HitRatio, len(gpuOnly.Moves))
	case result(t, rep, costplan.Recompute).Loads.Blocks != 0:
		t.Error("always-recompute loaded blocks")
	case result(t, rep, costplan.Reload).Recomputes.Blocks != result(t, rep, costplan.Reload).Recomputes.Forced:
		t.Error("always-reload recomputed cached blocks it was not forced to")
	}
}

// TestDeterministicJSON: the same trace and configuration give
// byte-identical JSON.
func TestDeterministicJSON(t *testing.T) {
	cfg := testConfig()
	cfg.WriteThrough = false // write-back: demotions, waits for space
	var out [2]bytes.Buffer
	for i := range out {
		src, _ := bundled()
		rep, err := Run(src, cfg, Options{SweepHost: []Bytes{0, 64 << 30}})
		if err != nil {
			t.Fatal(err)
		}
		if err := rep.WriteJSON(&out[i]); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(out[0].Bytes(), out[1].Bytes()) {
		t.Fatal("two runs gave different JSON")
	}
	if !strings.Contains(out[0].String(), `"host_sweep"`) {
		t.Error("the JSON has no host sweep")
	}
}

func TestWriteBack(t *testing.T) {
	cfg := testConfig()
	cfg.WriteThrough, cfg.Baselines = false, false
	cfg.HostBytes = min(cfg.HostBytes, 16<<30)
	src, _ := bundled()
	res := runOrFail(t, src, cfg).Results[0]
	if res.Demotions.GPU == 0 || res.Demotions.Host == 0 {
		t.Errorf("write-back demoted %+v blocks; want demotions from the GPU and the host", res.Demotions)
	}
	if res.HitRatio.Host == 0 || res.HitRatio.NVMe == 0 {
		t.Errorf("write-back hit ratios %+v: lower tiers unused", res.HitRatio)
	}
	t.Logf("write-back: %d space waits, %d dropped offloads, hit %+v, TTFT %+v", res.SpaceWaits, res.DroppedOffloads, res.HitRatio, res.TTFT)
}

func TestPoliciesAndAdmission(t *testing.T) {
	for _, p := range []string{"lru", "s3fifo", "2q", "cost-aware"} {
		for _, adm := range []string{"all", "seen-twice"} {
			cfg := testConfig()
			cfg.Policy, cfg.NVMeAdmission, cfg.Baselines = p, adm, false
			cfg.HostBytes = min(cfg.HostBytes, 64<<30)
			src, _ := bundled()
			res := runOrFail(t, src, cfg).Results[0]
			if res.HitRatio.Overall < 0.5 {
				t.Errorf("%s, admission %s: hit ratio %.4f", p, adm, res.HitRatio.Overall)
			}
		}
	}
}

func TestBadTraceLine(t *testing.T) {
	lines := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [1]}
{"timestamp": 2, "input_length": 600, "output_length": 5, "hash_ids": [1, 3]}
`
	src := Source{Name: "bad.jsonl", Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(lines)), nil }}
	_, err := Run(src, DefaultConfig(), Options{})
	var le *trace.LineError
	if !errors.As(err, &le) || le.Line != 2 || le.Field != "hash_ids" || !strings.Contains(err.Error(), "bad.jsonl:2") {
		t.Fatalf("error %v, want one naming bad.jsonl line 2 and hash_ids", err)
	}
	src.SkipBad = true
	rep, err := Run(src, DefaultConfig(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.SkippedLines != 1 || rep.Results[0].Requests != 2 {
		t.Errorf("skipped %d lines, replayed %d requests; want 1 and 2", rep.SkippedLines, rep.Results[0].Requests)
	}
	empty := Source{Name: "empty", Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("\n")), nil }}
	if _, err := Run(empty, DefaultConfig(), Options{}); err == nil || !strings.Contains(err.Error(), "no request") {
		t.Errorf("empty trace: %v", err)
	}
}

func TestNativeTraceWithSalts(t *testing.T) {
	// Two tenants send the same tokens: no hit crosses salts.
	var b strings.Builder
	tokens := make([]int32, 64)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	for i := range 6 {
		req := trace.Request{Arrival: time.Duration(i) * time.Second, Salt: uint64(i % 2), BlockTokens: 16,
			OutputTokens: 4, Tokens: tokens, InputTokens: len(tokens)}
		b.Write(trace.AppendNative(nil, &req))
	}
	src := Source{Name: "native", Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(b.String())), nil }}
	cfg := DefaultConfig()
	cfg.Baselines = false
	rep := runOrFail(t, src, cfg)
	res := rep.Results[0]
	// 6 requests of 4 blocks; the first of each tenant misses.
	if rep.BlockTokens != 16 || res.Blocks != 24 || res.MissBlocks != 8 {
		t.Errorf("block tokens %d, %d blocks, %d missed; want 16, 24, 8", rep.BlockTokens, res.Blocks, res.MissBlocks)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	cases := []struct{ json, field string }{
		{`{"modle": "x"}`, "modle"},
		{`{"tp": "8"}`, "tp"},
		{`{"tp": 0}`, "tp"},
		{`{"gpu_bytes": "lots"}`, "gpu_bytes"},
		{`{"gpu_bytes": 0}`, "gpu_bytes"},
		{`{"host_bytes": -1}`, "host_bytes"},
		{`{"decode_token_time": 30}`, "decode_token_time"},
		{`{"decode_token_time": "-1ms"}`, "decode_token_time"},
		{`{"policy": "fifo"}`, "policy"},
		{`{"nvme_admission": "never"}`, "nvme_admission"},
		{`{"nvme_writes": "some"}`, "nvme_writes"},
		{`{"nvme_write_share": 1.5}`, "nvme_write_share"},
		{`{"nvme_dwpd": -1}`, "nvme_dwpd"},
		{`{"strategy": "magic"}`, "strategy"},
		{`{"prefill_slots": -1}`, "prefill_slots"},
		{`{"max_hole_blocks": -1}`, "max_hole_blocks"},
		{`{"block_tokens": -5}`, "block_tokens"},
	}
	for _, c := range cases {
		_, err := LoadConfig(strings.NewReader(c.json))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%s: error %v, want one naming %s", c.json, err, c.field)
		}
	}
	for _, bad := range []string{`[]`, `{"tp": 1} {}`, `{`} {
		if _, err := LoadConfig(strings.NewReader(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	cfg, err := LoadConfig(strings.NewReader(`{"host_bytes": "512GiB", "nvme_bytes": 8796093022208, "decode_token_time": "25ms", "write_through": false}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HostBytes != 512<<30 || cfg.NVMeBytes != 8<<40 || cfg.DecodeTokenTime != Duration(25*time.Millisecond) ||
		cfg.WriteThrough || cfg.Model != DefaultConfig().Model {
		t.Errorf("loaded %+v", cfg)
	}
	// Presets are checked when a run starts, naming the field.
	for field, edit := range map[string]func(*Config){
		"model":     func(c *Config) { c.Model = "gpt-9" },
		"gpu":       func(c *Config) { c.GPU = "tpu" },
		"host_link": func(c *Config) { c.HostLink = "carrier-pigeon" },
		"nvme_link": func(c *Config) { c.NVMeLink = "floppy" },
		"gpu_bytes": func(c *Config) { c.GPUBytes = 1 << 20 },
	} {
		c := DefaultConfig()
		edit(&c)
		_, err := Run(BundledSource(), c, Options{})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("%s: error %v", field, err)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for s, want := range map[string]Bytes{"40GiB": 40 << 30, "2TiB": 2 << 40, "512 MB": 512e6, "1.5GiB": 3 << 29, "1000": 1000, "0": 0} {
		if got, err := ParseBytes(s); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "GiB", "-1GiB", "1e30TiB", "lots", "NaN"} {
		if _, err := ParseBytes(s); err == nil {
			t.Errorf("ParseBytes(%q) did not fail", s)
		}
	}
	if s := Bytes(256 << 30).String(); s != "256GiB" {
		t.Errorf("String = %q", s)
	}
}

func TestTextReportAndPlotData(t *testing.T) {
	cfg := testConfig()
	src, _ := bundled()
	rep, err := Run(src, cfg, Options{SweepHost: []Bytes{32 << 30, 128 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"TTFT p50", "cost", "reload", "recompute", "gpu-only", "none", "hit ratio against host capacity", "32GiB"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, b.String())
		}
	}
	// The plots' data (internal/replayplot draws it): 101 quantiles per
	// strategy, in order.
	for _, res := range rep.Results {
		if q := res.TTFTQuantiles; len(q) != 101 || !slices.IsSorted(q) {
			t.Errorf("%s: TTFTQuantiles %v, want 101 in increasing order", res.Strategy, q)
		}
	}
}

func stringSource(name, lines string) Source {
	return Source{Name: name, Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(lines)), nil }}
}

func TestEmptyPromptAndBlockSizes(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Baselines = false
	rep := runOrFail(t, stringSource("empty-prompt", `{"timestamp": 0, "input_length": 0, "output_length": 3, "hash_ids": []}
{"timestamp": 5, "input_length": 10, "output_length": 3, "hash_ids": [7]}
`), cfg)
	if res := rep.Results[0]; res.Requests != 2 || res.Blocks != 1 || res.TTFT.P50 < 0 {
		t.Errorf("%+v", res)
	}
	cfg.BlockTokens = 16
	_, err := Run(BundledSource(), cfg, Options{})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "block_tokens" {
		t.Errorf("block_tokens 16 on a 512-token trace: %v", err)
	}
	mixed := `{"arrival_us":0,"block_tokens":16,"output_tokens":1,"tokens":[1,2,3]}
{"arrival_us":1,"block_tokens":32,"output_tokens":1,"tokens":[1,2,3]}
`
	cfg.BlockTokens = 0
	if _, err := Run(stringSource("mixed", mixed), cfg, Options{}); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("a block size change mid-trace: %v", err)
	}
}

// TestHolesRecomputed: on the bundled trace with small tiers (24 GiB of
// GPU KV, 16 GiB host, 32 GiB NVMe), lookups that go on past missing
// blocks (MaxHoleBlocks) find cached blocks after them; the report counts
// the holes, and the cost plan's TTFT is no worse than when a lookup stops
// at the first missing block. It needs the whole trace (.ci/run runs it
// without the invariants tag).
func TestHolesRecomputed(t *testing.T) {
	if quick {
		t.Skip("needs the whole trace: too slow under the invariants tag")
	}
	cfg := DefaultConfig()
	cfg.GPUBytes, cfg.HostBytes, cfg.NVMeBytes = 24<<30, 16<<30, 32<<30
	cfg.Baselines = false
	src := BundledSource()
	stop := runOrFail(t, src, cfg)
	cfg.MaxHoleBlocks = 16
	past := runOrFail(t, src, cfg)
	s, h := &stop.Results[0], &past.Results[0]
	t.Logf("without holes: TTFT p50 %.4f p90 %.4f mean %.4f s, hit %.4f; with up to 16: p50 %.4f p90 %.4f mean %.4f s, hit %.4f, %d holes",
		s.TTFT.P50, s.TTFT.P90, s.TTFT.Mean, s.HitRatio.Overall, h.TTFT.P50, h.TTFT.P90, h.TTFT.Mean, h.HitRatio.Overall, h.Manager.HoleBlocks)
	if s.Manager.HoleBlocks != 0 {
		t.Errorf("%d holes with MaxHoleBlocks 0", s.Manager.HoleBlocks)
	}
	if h.Manager.HoleBlocks == 0 {
		t.Fatal("no hole on the bundled trace with a small GPU tier: the test shows nothing")
	}
	if h.HitRatio.Overall <= s.HitRatio.Overall {
		t.Errorf("hit ratio %.4f with holes, %.4f without: the blocks after holes were not served", h.HitRatio.Overall, s.HitRatio.Overall)
	}
	for _, c := range []struct {
		name          string
		holes, noHole float64
	}{{"p50", h.TTFT.P50, s.TTFT.P50}, {"p90", h.TTFT.P90, s.TTFT.P90}, {"mean", h.TTFT.Mean, s.TTFT.Mean}} {
		if c.holes > 1.01*c.noHole {
			t.Errorf("TTFT %s %.4f s with holes, %.4f s without", c.name, c.holes, c.noHole)
		}
	}
	var txt bytes.Buffer
	if err := past.WriteText(&txt); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(txt.String(), fmt.Sprintf("cost %d", h.Manager.HoleBlocks)) {
		t.Errorf("the report does not count the holes:\n%s", txt.String())
	}
}
