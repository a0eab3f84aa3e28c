package replay

import (
	"io"
	"strings"
	"testing"
	"time"

	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/trace"
)

// linesSource is a native trace of reqs, 16 tokens a block.
func linesSource(name string, reqs ...trace.Request) Source {
	var b []byte
	for i := range reqs {
		b = trace.AppendNative(b, &reqs[i])
	}
	return Source{Name: name, Format: trace.FormatNative, Open: func() (io.ReadCloser, error) {
		return io.NopCloser(strings.NewReader(string(b))), nil
	}}
}

// keysFrom returns n keys from first on.
func keysFrom(first uint64, n int) []uint64 {
	k := make([]uint64, n)
	for i := range k {
		k[i] = first + uint64(i)
	}
	return k
}

// runEngine replays src under s and returns the engine, for its counts.
func runEngine(t *testing.T, src Source, cfg Config, s costplan.Strategy) *engine {
	t.Helper()
	e, err := newEngine(cfg, s)
	if err != nil {
		t.Fatal(err)
	}
	e.name = src.Name
	rc, err := src.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if err := e.run(trace.NewReader(rc, trace.Options{Format: src.Format, Name: src.Name})); err != nil {
		t.Fatal(err)
	}
	return e
}

// A request whose insert finds the GPU's slots pinned by copies waits for
// as many slots to be freed as it lacked, and is tried again once: not after
// each of the copies. A fills the GPU's 32 slots; B, queued behind it,
// starts as A ends, while A's 32 write-through copies to the host tier
// still read every slot (one copy a block on the modelled channel). Before,
// B was tried again after each copy: 33 inserts.
func TestSpaceWaitRetriesOnce(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Baselines, cfg.Mover = false, MoverModel
	cfg.GPUBytes = 32 * 16 * (128 << 10) // 32 blocks of 16 tokens of the 8B's 128 KiB a token
	a := trace.Request{BlockTokens: 16, InputTokens: 32 * 16, OutputTokens: 1, Keys: keysFrom(1, 32)}
	b := a
	b.Keys = keysFrom(1001, 32)
	e := runEngine(t, linesSource("two", a, b), cfg, costplan.Cost)
	if e.res.SpaceWaits != 1 {
		t.Fatalf("%d requests waited for GPU slots, want B alone", e.res.SpaceWaits)
	}
	if e.res.insertTries != 3 {
		t.Fatalf("%d inserts into the GPU, want 3: A's, B's that found no slot, B's once A's copies ended", e.res.insertTries)
	}
	if e.res.UncachedBlocks != 0 || e.res.Requests != 2 {
		t.Fatalf("%d requests, %d blocks not kept in the GPU; want 2 and none", e.res.Requests, e.res.UncachedBlocks)
	}
	if d := e.ttfts[1] - e.ttfts[0]; d <= 0 || d > time.Second {
		t.Fatalf("B's TTFT %v, A's %v", e.ttfts[1], e.ttfts[0])
	}
}
