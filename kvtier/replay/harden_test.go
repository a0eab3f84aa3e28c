package replay

import (
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"
	"unsafe"

	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/trace"
)

// burst is a trace of n requests that all arrive at once, made line by line
// as it is read (never held in memory): each has its own 16 blocks of 16
// tokens and one output token.
type burst struct {
	n, i int
	line []byte
	req  trace.Request
	same bool // every request has the same blocks
}

func newBurst(n int) *burst {
	return &burst{n: n, req: trace.Request{BlockTokens: 16, InputTokens: 256, OutputTokens: 1, Keys: make([]uint64, 16)}}
}

func (b *burst) Read(p []byte) (int, error) {
	if len(b.line) == 0 {
		if b.i == b.n {
			return 0, io.EOF
		}
		for k := range b.req.Keys {
			if b.req.Keys[k] = uint64(k) + 1; !b.same {
				b.req.Keys[k] |= uint64(b.i) << 8
			}
		}
		b.i++
		b.line = trace.AppendNative(b.line[:0], &b.req)
	}
	n := copy(p, b.line)
	b.line = b.line[n:]
	return n, nil
}

func burstSource(n int) Source {
	return Source{Name: "burst", Format: trace.FormatNative, Open: func() (io.ReadCloser, error) { return io.NopCloser(newBurst(n)), nil }}
}

// A burst of 300,000 requests at one timestamp under an 8 MiB budget stops
// with an error that names the budget and the line, long before the end,
// instead of growing (before: 5.9 GB for a burst of this size from
// Mooncake). The budget is small so that the test stays fast under -race
// and the invariants tag, which checks the engine at every event.
func TestBurstOverMemoryBudget(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Baselines = false
	cfg.MemoryBudget = 8 << 20
	start := time.Now()
	_, err := Run(burstSource(300_000), cfg, Options{})
	if err == nil || !strings.Contains(err.Error(), "over the memory budget of 8MiB") || !strings.Contains(err.Error(), "burst: at line") {
		t.Fatalf("300k-request burst under an 8MiB budget: %v, want an error naming the budget and the line", err)
	}
	t.Logf("%v (after %v)", err, time.Since(start).Round(time.Millisecond))
	// The same budget holds a trace that the server keeps up with, and the
	// report states the bound.
	rep, err := Run(burstSource(20), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	queued := 20 * (int64(unsafe.Sizeof(request{})) + 16*8) // the requests and their keys
	if rep.PeakInFlightRequests != 20 || rep.PeakInFlightBytes < Bytes(queued) || rep.PeakInFlightBytes > Bytes(2*queued) {
		t.Fatalf("peak in flight %d requests, %v; want 20 and about %v", rep.PeakInFlightRequests, rep.PeakInFlightBytes, Bytes(queued))
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil || !strings.Contains(b.String(), "at most 20 requests in flight") {
		t.Fatalf("the text report does not state the bound: %v\n%s", err, b.String())
	}
}

// Arrivals and durations that would overflow the virtual clock are input
// errors naming the field and the line, not wrong TTFTs.
func TestClockOverflowIsAnInputError(t *testing.T) {
	line := func(arrival time.Duration, out int) string {
		req := trace.Request{Arrival: arrival, BlockTokens: 16, InputTokens: 32, OutputTokens: out, Keys: []uint64{1, 2}}
		return string(trace.AppendNative(nil, &req))
	}
	src := func(lines ...string) Source {
		return Source{Name: "t.jsonl", Open: func() (io.ReadCloser, error) {
			return io.NopCloser(strings.NewReader(strings.Join(lines, ""))), nil
		}}
	}
	cfg := DefaultConfig()
	cfg.Baselines = false
	nearEnd := time.Duration(math.MaxInt64) - time.Minute
	for _, tc := range []struct {
		name   string
		src    Source
		decode time.Duration
		line   int
		field  string
	}{
		{"arrival near the clock's end", src(line(0, 4), line(nearEnd, 4000)), 0, 2, "arrival_us"},
		{"decode_token_time 2540400h", src(line(0, 1000)), 2540400 * time.Hour, 1, "output_tokens"},
		{"decode longer than the clock", src(line(0, 4), line(time.Hour, 1<<30)), time.Hour * 24 * 365, 2, "output_tokens"},
	} {
		c := cfg
		if tc.decode != 0 {
			c.DecodeTokenTime = Duration(tc.decode)
		}
		_, err := Run(tc.src, c, Options{})
		var le *trace.LineError
		if !errors.As(err, &le) || le.Line != tc.line || le.Field != tc.field || !strings.Contains(err.Error(), "virtual clock") {
			t.Errorf("%s: %v, want a line error naming line %d, %s and the clock", tc.name, err, tc.line, tc.field)
		}
	}
	// What the per-request checks cannot see is caught when the event is
	// scheduled.
	e, err := newEngine(cfg, costplan.Cost)
	if err != nil {
		t.Fatal(err)
	}
	e.now = time.Duration(math.MaxInt64) - time.Second
	wrapped := e.now + time.Hour
	e.schedule(event{at: wrapped, kind: evDecodeDone})
	if e.clock.err == nil || !strings.Contains(e.clock.err.Error(), "overflows the clock") {
		t.Fatalf("a wrapped event time: %v", e.clock.err)
	}
}

func TestConfigNullIsRefused(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{"null", "found null"},
		{" null \n", "found null"},
		{`{"tp": null}`, "tp: null"},
		{`{"memory_budget": -1}`, "memory_budget"},
	} {
		if _, err := LoadConfig(strings.NewReader(tc.json)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %q: %v, want an error naming %q", tc.json, err, tc.want)
		}
	}
}

// --skip-bad over a trace whose every line is bad says how many lines were
// skipped and why, not only that there is no request.
func TestSkipBadAllBad(t *testing.T) {
	lines := "{\"timestamp\": 0}\nnot json\n{\"timestamp\": 1, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1]}\n"
	src := Source{Name: "bad.jsonl", SkipBad: true, Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(lines)), nil }}
	_, err := Run(src, DefaultConfig(), Options{})
	if err == nil || !strings.Contains(err.Error(), "all 3 lines were malformed and skipped") || !strings.Contains(err.Error(), "bad.jsonl:1:") {
		t.Fatalf("all-bad trace with SkipBad: %v", err)
	}
}
