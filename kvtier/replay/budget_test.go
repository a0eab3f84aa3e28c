package replay

import (
	"errors"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/trace"
)

var errMeasured = errors.New("measured")

// heapPerRequest replays a burst of n requests of 16 blocks at one
// timestamp under cfg and returns, between the 1,024th arrival and the
// last, the live heap they grew (runtime.ReadMemStats after a collection)
// and the growth of the replay's estimate, per request.
func heapPerRequest(t *testing.T, cfg Config, n int, same bool) (heap, est float64) {
	t.Helper()
	e, err := newEngine(cfg, costplan.Cost)
	if err != nil {
		t.Fatal(err)
	}
	b := newBurst(n)
	b.same = same
	var ms runtime.MemStats
	var heap0, est0 int64
	first, last := 1024, n/1024*1024
	e.name = "burst"
	e.progress = func(i int) {
		if i != first && i != last {
			return
		}
		runtime.GC()
		runtime.ReadMemStats(&ms)
		if i == first {
			heap0, est0 = int64(ms.HeapAlloc), e.flight.bytes
			return
		}
		heap, est = float64(int64(ms.HeapAlloc)-heap0), float64(e.flight.bytes-est0)
		e.recordErr = errMeasured // the rest is of no use here
	}
	err = e.run(trace.NewReader(io.NopCloser(b), trace.Options{Format: trace.FormatNative, Name: "burst"}))
	if !errors.Is(err, errMeasured) {
		t.Fatalf("the burst ended before the last arrival: %v", err)
	}
	return heap / float64(last-first), est / float64(last-first)
}

// The memory budget's estimate is what the requests in flight really hold,
// measured: while they wait (a request and its keys; before, two leases a
// key were charged, 8x the heap of a waiting request) and once started
// (with its two leases). Within 0.67x to 1.5x of the live heap they add.
func TestMemoryEstimateMatchesHeap(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Baselines, cfg.MemoryBudget = false, 0
	heap, est := heapPerRequest(t, cfg, 8*1024, false) // one prefill slot: the others wait
	t.Logf("waiting: %.0f B of heap a request, estimated %.0f B", heap, est)
	if est < heap/1.5 || est > 1.5*heap {
		t.Errorf("a waiting request of 16 blocks: estimated %.0f B, measured %.0f B of heap", est, heap)
	}
	// Every request started at once, each with its two leases, on blocks
	// they share (the manager's records do not grow with them).
	cfg.PrefillSlots, cfg.Model, cfg.GPUBytes = 0, "llama-3.2-1b", 64<<30
	heap, est = heapPerRequest(t, cfg, 3*1024, true)
	t.Logf("started: %.0f B of heap a request, estimated %.0f B", heap, est)
	if est < heap/1.5 || est > 1.5*heap {
		t.Errorf("a started request of 16 blocks: estimated %.0f B, measured %.0f B of heap", est, heap)
	}
}

// promptsSharing is a trace of n requests, one every gap, each of keys
// blocks of 16 tokens: all but the last block shared, so that with a
// prefix cache each prefills one block and without one all of them.
func promptsSharing(n, keys int, gap time.Duration) Source {
	reqs := make([]trace.Request, n)
	for i := range reqs {
		k := keysFrom(1, keys)
		k[keys-1] = uint64(1000 + i)
		reqs[i] = trace.Request{Arrival: time.Duration(i) * gap, BlockTokens: 16, InputTokens: 16 * keys, OutputTokens: 1, Keys: k}
	}
	return linesSource("shared", reqs...)
}

// A strategy that passes the memory budget stops and is named in the
// report; the strategies that finished are reported. Without a prefix
// cache the GPU cannot keep up with the trace and its queue grows past the
// budget; with one it keeps up.
func TestOverBudgetKeepsTheOthers(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MemoryBudget = 96 << 10
	rep, err := Run(promptsSharing(200, 32, 4*time.Millisecond), cfg, Options{})
	var be *BudgetError
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "strategy none") || !strings.Contains(err.Error(), "over the memory budget of 96KiB") {
		t.Fatalf("error %v, want none's over the budget", err)
	}
	if rep == nil || len(rep.OverBudget) != 1 || rep.OverBudget[0].Strategy != "none" {
		t.Fatalf("report %+v, want none over the budget", rep)
	}
	var got []string
	for _, r := range rep.Results {
		got = append(got, r.Strategy)
		if r.Requests != 200 {
			t.Errorf("%s replayed %d requests of 200", r.Strategy, r.Requests)
		}
	}
	if want := []string{"cost", "reload", "recompute", "gpu-only"}; !slices.Equal(got, want) {
		t.Fatalf("strategies reported %v, want %v", got, want)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	text := b.String()
	for _, want := range []string{"NOT FINISHED, over the memory budget of 96KiB", "  none: stopped at line ", "\n       cost ", "\n   gpu-only "} {
		if !strings.Contains(text, want) {
			t.Errorf("the text report lacks %q:\n%s", want, text)
		}
	}
}
