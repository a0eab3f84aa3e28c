package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/httpapi"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/stack"
	"kvtier.dev/kvtier/transfer"
)

// recorder is an Observer that keeps what it is told.
type recorder struct {
	mu     sync.Mutex
	passes []cost.PrefillSample
	from   []kvtier.Tier // each pass's loads' tier
	loads  []kvtier.Tier
	bytes  []int64
}

func (r *recorder) Pass(s cost.PrefillSample, from kvtier.Tier) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s.Seconds <= 0 {
		panic("a pass of no time")
	}
	r.passes, r.from = append(r.passes, s), append(r.from, from)
}

func (r *recorder) Load(t kvtier.Tier, b int64, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.loads, r.bytes = append(r.loads, t), append(r.bytes, b)
}

func (r *recorder) take() (passes []cost.PrefillSample, loads []kvtier.Tier, bytes []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	passes, loads, bytes = r.passes, r.loads, r.bytes
	r.passes, r.from, r.loads, r.bytes = nil, nil, nil, nil
	return
}

// shape is a pass sample's prefix and tokens.
func shape(s cost.PrefillSample) [2]int { return [2]int{s.Prefix, s.Tokens} }

// newTinyEngine is an engine over the tiny model on the CPU runner and a
// cache of 32 GPU and 64 host blocks on the simulated device; edit, if
// given, changes the options and the configuration before they are used.
func newTinyEngine(t *testing.T, obs Observer, edit ...func(*stack.Options, *Config)) (*Engine, *stack.Cache) {
	t.Helper()
	return newTinyEngineOn(t, cudastream.H200Link(), obs, edit...)
}

// newTinyEngineOn is newTinyEngine on a simulated device of link.
func newTinyEngineOn(t *testing.T, link cudastream.LinkModel, obs Observer, edit ...func(*stack.Options, *Config)) (*Engine, *stack.Cache) {
	t.Helper()
	c := model.Tiny()
	const cacheSlots, scratch, ctxTokens = 32, 64, 128
	slots := cacheSlots + scratch
	dev, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: int64(slots)*c.BlockBytes() + 1<<20, Link: link, Clock: cudastream.SimWallClock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	region, err := dev.Alloc(int64(slots) * c.BlockBytes())
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.NewCPU(c, 1, slots)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewCPURunner(m, dev, region, cacheSlots)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	layout, err := transfer.BlockFirstLayout(region, c.Layers, 2, cacheSlots, c.PartBytes())
	if err != nil {
		t.Fatal(err)
	}
	opts := stack.Options{Device: dev, GPU: layout, BlockTokens: c.BlockTokens,
		HostBytes: 64 * ((c.BlockBytes() + 4095) &^ 4095), WriteThrough: true, Planner: kvtier.LoadAll{}}
	cfg := Config{Model: c, Runner: r, CacheSlots: cacheSlots, ScratchSlots: scratch,
		ContextTokens: ctxTokens, Strategy: costplan.Reload, Observer: obs}
	for _, f := range edit {
		f(&opts, &cfg)
	}
	cache, err := stack.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cache.Close() })
	cfg.Cache = cache
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, cache
}

// complete runs one request to its end.
func complete(t *testing.T, e *Engine, id string, prompt []int32) httpapi.Usage {
	t.Helper()
	req := &httpapi.Request{ID: id, Tokens: prompt, MaxTokens: 2, Arrival: time.Now()}
	out := httpapi.NewStream(req.MaxTokens)
	if err := e.Submit(context.Background(), req, out); err != nil {
		t.Fatal(err)
	}
	for range out.Tokens() {
	}
	u, err := out.Result()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestObserverSeesCleanMeasurements: the engine reports a prefill from
// scratch and a suffix after GPU hits as passes of the right prefix and
// tokens, a pass with loads with their bytes when it saw their end, and a
// load only as one of the host tier's bytes.
func TestObserverSeesCleanMeasurements(t *testing.T) {
	rec := &recorder{}
	e, cache := newTinyEngine(t, rec)
	bt := e.cfg.Model.BlockTokens
	prompt := make([]int32, 10*bt+2) // 10 full blocks and 2 tokens
	for i := range prompt {
		prompt[i] = int32(7 + i%300)
	}

	complete(t, e, "first", prompt)
	passes, loads, _ := rec.take()
	// The cache serves the full blocks before the one of the last
	// position: 10, all computed here.
	if len(passes) != 1 || shape(passes[0]) != [2]int{0, len(prompt)} || passes[0].LoadBytes != 0 || len(loads) != 0 {
		t.Fatalf("a prefill from scratch: passes %v loads %v, want one pass of %d tokens after 0", passes, loads, len(prompt))
	}

	u := complete(t, e, "again", prompt)
	passes, loads, _ = rec.take()
	if u.LoadedTokens[kvtier.GPU] != 10*bt {
		t.Fatalf("the same prompt again found %d tokens on the GPU, want %d", u.LoadedTokens[kvtier.GPU], 10*bt)
	}
	if len(passes) != 1 || shape(passes[0]) != [2]int{10 * bt, 2} || passes[0].PrefixPairs != 0 || passes[0].LoadBytes != 0 || len(loads) != 0 {
		t.Fatalf("a suffix after GPU hits: passes %v loads %v, want one pass of 2 tokens after %d", passes, loads, 10*bt)
	}

	// Down to the host tier: the next request loads every block.
	ctx := context.Background()
	if err := cache.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cache.Evict(ctx, 0, prompt[:10*bt], kvtier.Host); err != nil {
		t.Fatal(err)
	}
	u = complete(t, e, "loaded", prompt)
	passes, loads, bytes := rec.take()
	if u.LoadedTokens[kvtier.Host] != 10*bt {
		t.Fatalf("after eviction %v tokens per tier loaded, want %d from the host", u.LoadedTokens, 10*bt)
	}
	for _, p := range passes { // reported only if the engine saw the loads end
		if shape(p) != [2]int{10 * bt, 2} || p.LoadBytes != 10*e.block || p.LoadEndSeconds < p.LoadStartSeconds {
			t.Fatalf("the pass that loaded: %+v; want 2 tokens after %d, with %d bytes loaded", p, 10*bt, 10*e.block)
		}
	}
	for i, tier := range loads { // the wait may not have blocked: then no sample
		if tier != kvtier.Host || bytes[i] != 10*e.block {
			t.Fatalf("load sample %d: %d bytes from %v, want %d from the host", i, bytes[i], tier, 10*e.block)
		}
	}
}

// TestPassShape: a pass's computed and present tokens and the pairs
// between them, for blocks of 4 tokens and 2 more after them.
func TestPassShape(t *testing.T) {
	for _, c := range []struct {
		compute                []bool
		tokens, present, pairs int
	}{
		{nil, 2, 0, 0},
		{[]bool{true, true}, 10, 0, 0},
		{[]bool{false, false}, 2, 8, 16},                    // a suffix: 2 × 8
		{[]bool{false, true, true}, 10, 4, 40},              // 10 × 4
		{[]bool{true, false, true}, 10, 4, 4*4 + 2*4},       // a recomputed head before a present block
		{[]bool{false, true, false}, 6, 8, 4*4 + 2*8},       // a hole
		{[]bool{true, true, false, false}, 10, 8, 2 * 8},    // only the tail sees the present blocks
		{[]bool{false, false, false, false}, 2, 16, 2 * 16}, // every block present
	} {
		n := len(c.compute)*4 + 2
		tokens, present, pairs := passShape(c.compute, 4, n)
		if tokens != c.tokens || present != c.present || pairs != int64(c.pairs) {
			t.Errorf("passShape(%v) = %d, %d, %d; want %d, %d, %d", c.compute, tokens, present, pairs, c.tokens, c.present, c.pairs)
		}
	}
}
