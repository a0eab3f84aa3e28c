package replay

import (
	"math"
	"strings"
	"testing"
	"time"

	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/trace"
)

// The header gives the trace's arrival span and the replay's apart, and
// flags a replay bound by KV memory with the KV it needed: 10 requests of
// 20 blocks, one every 100 ms, each decoding 3 s, on a GPU tier of 32
// blocks, so that each waits for the one before it to end. On a GPU tier
// that holds them all, nothing waits and nothing is flagged.
func TestHeaderSpansAndKVMemoryBound(t *testing.T) {
	reqs := make([]trace.Request, 10)
	for i := range reqs {
		reqs[i] = trace.Request{Arrival: time.Duration(i) * 100 * time.Millisecond, BlockTokens: 16, InputTokens: 20 * 16,
			OutputTokens: 101, Keys: keysFrom(uint64(100*i+1), 20)}
	}
	cfg := DefaultConfig()
	cfg.Baselines, cfg.Mover = false, MoverModel
	cfg.GPUBytes = 32 * 16 * (128 << 10) // 32 blocks of the 8B's 16 tokens
	rep := runOrFail(t, linesSource("kv", reqs...), cfg)
	res := rep.Results[0]
	if res.ArrivalSpanSeconds != 0.9 || res.SpanSeconds < 30 || res.SpanSeconds > 31 {
		t.Fatalf("arrivals over %v s, replay over %v s; want 0.9 and 30 to 31", res.ArrivalSpanSeconds, res.SpanSeconds)
	}
	if want := int64(40 * 16 * (128 << 10)); res.KVNeededBytes != want || res.GPUMemoryWaitSeconds < 0.9*res.SpanSeconds-3 {
		t.Fatalf("waited %v s of %v for GPU memory, needing %d bytes of KV; want about all of it but the first request's, and %d bytes",
			res.GPUMemoryWaitSeconds, res.SpanSeconds, res.KVNeededBytes, want)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	head, _, _ := strings.Cut(b.String(), "\n\n")
	for _, want := range []string{"arriving over 1 s; replayed (cost) over 30 s, to the last request done",
		"with the requests running it needed up to 80.0 MiB of KV at once, on a GPU tier of 64MiB: BOUND BY GPU KV MEMORY"} {
		if !strings.Contains(head, want) {
			t.Errorf("the header lacks %q:\n%s", want, head)
		}
	}
	cfg.GPUBytes = 40 << 30
	rep = runOrFail(t, linesSource("kv", reqs...), cfg)
	if res := rep.Results[0]; res.GPUMemoryWaitSeconds != 0 || res.SpanSeconds > 4 {
		t.Fatalf("on a GPU tier that holds every request: waited %v s for GPU memory, replay over %v s", res.GPUMemoryWaitSeconds, res.SpanSeconds)
	}
	b.Reset()
	if err := rep.WriteText(&b); err != nil || strings.Contains(b.String(), "GPU KV memory") {
		t.Fatalf("a replay that never waited for GPU memory says it did (%v):\n%s", err, b.String())
	}
}

// The report's means over requests do not wrap: seven requests of 10^9
// tokens queue for up to 98 years each, and their waits summed as a
// time.Duration went past its 292 years, giving a mean queue wait of
// -1.3e9 s (and, before, a mean TTFT of -868,076,497 s).
func TestMeansOfHugeRequests(t *testing.T) {
	e, err := newEngine(DefaultConfig(), costplan.Cost)
	if err != nil {
		t.Fatal(err)
	}
	const d = time.Duration(math.MaxInt64/7) + time.Hour
	for range 7 {
		e.res.Requests++
		e.res.QueueWait.Add(d)
		e.res.PlannedTime.Add(d)
		e.res.PlannedLoadAll.Add(d)
		e.res.PlannedRecomputeAll.Add(d)
		e.ttfts = append(e.ttfts, d)
	}
	res := e.result()
	want := d.Seconds()
	for name, got := range map[string]float64{"queue": res.QueueSeconds, "TTFT": res.TTFT.Mean, "planned": res.Plan.MeanPlannedSeconds,
		"load all": res.Plan.MeanLoadAllSeconds, "recompute all": res.Plan.MeanRecomputeAllSeconds} {
		if math.Abs(got-want) > 1e-9*want {
			t.Errorf("mean %s %v s, want %v s", name, got, want)
		}
	}
}
