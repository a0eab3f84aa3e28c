package httpapi_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"kvtier.dev/examples/server/internal/httpapi"
	"kvtier.dev/internal/benchserve"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/trace"
)

// cacheBackend is the model server bench-serve is tested against: a
// deterministic greedy "model" (each token a hash of the prompt and the
// position) with a prefix cache of 16-token blocks per salt. A cached
// prefix's block j is reported as loaded from tier j mod 3. With corrupt,
// an answer that used the cache differs from the no-cache one in its last
// token: the bug --verify exists to catch.
type cacheBackend struct {
	lim         httpapi.Limits
	blockTokens int
	corrupt     bool
	// tie, with corrupt, makes the corrupt token a near tie: with logprobs
	// asked for, every position lists the token and the next id 0.01 nats
	// apart, the swapped one too (as bf16 rounding flips a tie).
	tie bool
	// fullEvery, when above 0, refuses every such Submit (429).
	fullEvery int64
	// hold makes every request wait for its context to end.
	hold bool

	submits atomic.Int64
	mu      sync.Mutex
	seen    map[[2]uint64]bool
	noCache int
}

func newCacheBackend() *cacheBackend {
	return &cacheBackend{lim: httpapi.Limits{Model: "toy", ContextTokens: 4096, VocabSize: 256}, blockTokens: 16,
		seen: map[[2]uint64]bool{}}
}

func (b *cacheBackend) Limits() httpapi.Limits { return b.lim }
func (b *cacheBackend) QueueDepth() int        { return 0 }

func (b *cacheBackend) Submit(ctx context.Context, req *httpapi.Request, out *httpapi.Stream) error {
	if n := b.submits.Add(1); b.fullEvery > 0 && n%b.fullEvery == 0 {
		return httpapi.ErrQueueFull
	}
	go b.run(ctx, req, out)
	return nil
}

func (b *cacheBackend) run(ctx context.Context, req *httpapi.Request, out *httpapi.Stream) {
	if b.hold {
		<-ctx.Done()
		out.Finish(httpapi.Usage{}, ctx.Err())
		return
	}
	var u httpapi.Usage
	b.mu.Lock()
	if req.NoCache {
		b.noCache++
	} else {
		var parent uint64
		hit := true
		buf := make([]byte, 0, 16+4*b.blockTokens)
		for j := 0; (j+1)*b.blockTokens <= len(req.Tokens); j++ {
			buf = binary.LittleEndian.AppendUint64(buf[:0], uint64(req.Salt))
			buf = binary.LittleEndian.AppendUint64(buf, parent)
			for _, t := range req.Tokens[j*b.blockTokens : (j+1)*b.blockTokens] {
				buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
			}
			parent = xxhash.Sum64(buf)
			k := [2]uint64{uint64(req.Salt), parent}
			if hit && b.seen[k] {
				u.LoadedTokens[kvtier.Tier(j%3)] += b.blockTokens
			} else {
				hit = false
			}
			b.seen[k] = true
		}
	}
	b.mu.Unlock()
	h := xxhash.New()
	for _, t := range req.Tokens {
		binary.Write(h, binary.LittleEndian, t)
	}
	for i := range req.MaxTokens {
		binary.Write(h, binary.LittleEndian, int32(i))
		tok := int32(h.Sum64() % uint64(b.lim.VocabSize))
		next := (tok + 1) % int32(b.lim.VocabSize)
		lp := httpapi.TokenLogprobs{Logprob: -1, Top: []httpapi.TopToken{{ID: tok, Logprob: -1}, {ID: next, Logprob: -1.01}}}
		if b.corrupt && u.CachedTokens() > 0 && i == req.MaxTokens-1 {
			tok, next = next, tok
			lp.Top[0].ID, lp.Top[1].ID = tok, next
			if !b.tie {
				lp.Top = lp.Top[:1] // the reference's token nowhere near
			}
		}
		if req.Logprobs {
			out.SendLogprobs(tok, lp)
		} else {
			out.Send(tok)
		}
	}
	out.Finish(u, nil)
}

// serve starts the server's HTTP front over b on loopback.
func serve(t *testing.T, b *cacheBackend) string {
	t.Helper()
	api, err := httpapi.New(httpapi.Config{Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return srv.URL
}

// writeTestTrace writes a native trace of n requests, 0.2 ms apart: four
// conversations, two per tenant (salt), each tenant with its own system
// prompt; each turn extends the one before. Every prompt ends in a partial
// block of 13 tokens.
func writeTestTrace(t *testing.T, n int) string {
	t.Helper()
	var buf bytes.Buffer
	for i := range n {
		conv := i % 4
		turn := i/4 + 1
		keys := []string{fmt.Sprint(1000 + conv/2)} // a system prompt per tenant
		for k := range turn {
			keys = append(keys, fmt.Sprint(conv*100+k+1))
		}
		fmt.Fprintf(&buf, `{"arrival_us":%d,"salt":%d,"block_tokens":16,"input_tokens":%d,"output_tokens":5,"keys":[%s]}`+"\n",
			i*200, conv/2, len(keys)*16-3, strings.Join(keys, ","))
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// benchConfig is a bench-serve run of the trace at path against url.
func benchConfig(url, path string) benchserve.Config {
	c := benchserve.Config{URL: url, Speed: 1, Timeout: time.Minute, Vocab: 256}
	c.FileTrace(path)
	return c
}

func runBench(t *testing.T, c benchserve.Config) *benchserve.Report {
	t.Helper()
	rep, err := benchserve.Run(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestBenchServeEndToEnd replays a trace at its arrival times, then with a
// fixed concurrency and verification, against the server's HTTP front over
// a prefix-caching backend: every request completes, shared prefixes are
// reported cached on each tier, and the verification finds no difference.
func TestBenchServeEndToEnd(t *testing.T) {
	b := newCacheBackend()
	url := serve(t, b)
	path := writeTestTrace(t, 40)
	c := benchConfig(url, path)
	c.Speed = 4
	rep := runBench(t, c)
	if rep.Sent != 40 || rep.Completed != 40 || len(rep.Errors) != 0 || rep.Load != "trace arrivals at speed 4" {
		t.Fatalf("arrivals: %+v", rep)
	}
	// The trace spans 7.8 ms at speed 4: about 2 ms, and the run cannot be
	// shorter than the last arrival.
	if rep.WallSeconds < 0.0078/4 {
		t.Fatalf("the run took %.4f s: arrivals were not waited for", rep.WallSeconds)
	}

	c = benchConfig(url, path)
	c.Concurrency, c.Verify = 4, 5
	rep = runBench(t, c)
	if rep.Sent != 40 || rep.Completed != 40 || len(rep.Errors) != 0 || rep.CompletionTokens != 40*5 {
		t.Fatalf("report %+v", rep)
	}
	cr := rep.Cache
	if cr.RequestsWithTiers != 40 || cr.ByTier.GPU == 0 || cr.ByTier.Host == 0 || cr.ByTier.NVMe == 0 ||
		int64(cr.ByTier.Sum()) != cr.CachedTokens || cr.CachedFraction <= 0 || cr.CachedFraction >= 1 {
		t.Fatalf("cache %+v", cr)
	}
	if rep.TTFT.P50 <= 0 || rep.TTFT.P99 < rep.TTFT.P50 || rep.InterToken.P50 < 0 || rep.Latency.Max < rep.TTFT.Max {
		t.Fatalf("latencies ttft %+v itl %+v e2e %+v", rep.TTFT, rep.InterToken, rep.Latency)
	}
	if v := rep.Verify; v == nil || v.Compared != 8 || v.Mismatches != 0 || v.Errors != 0 {
		t.Fatalf("verify %+v", rep.Verify)
	}
	b.mu.Lock()
	noCache := b.noCache
	b.mu.Unlock()
	if noCache != 8 {
		t.Fatalf("the server saw %d no-cache requests, want 8", noCache)
	}
}

// TestBenchServeVerifyCatchesDifference: a server whose answers from its
// cache differ from its uncached ones is caught, on exactly the compared
// requests that hit the cache.
func TestBenchServeVerifyCatchesDifference(t *testing.T) {
	b := newCacheBackend()
	b.corrupt = true
	c := benchConfig(serve(t, b), writeTestTrace(t, 40))
	c.Concurrency, c.Verify = 1, 2
	rep := runBench(t, c)
	v := rep.Verify
	if v == nil || v.Compared != 20 || v.Mismatches == 0 || len(v.Examples) == 0 {
		t.Fatalf("verify %+v", v)
	}
	for _, m := range v.Examples {
		if m.Position != 4 || m.CachedTokens == 0 || m.Request%2 != 1 {
			t.Fatalf("mismatch %+v: want the last of 5 tokens, on a cached answer of an odd request", m)
		}
	}
	// With one client, request i finds the full blocks of the requests
	// before it: every odd request hits, at least its tenant's system
	// prompt (request 1 the one request 0 sent, request 3 request 2's).
	if v.Mismatches != 20 {
		t.Fatalf("%d mismatches, want 20 (every compared request hit the cache)", v.Mismatches)
	}
}

// TestBenchServeVerifyTellsNearTies: with logprobs, a cached answer whose
// first differing token was a near tie in both answers is counted as a tie,
// not a difference; the same run with the ties beyond the tolerance, or
// with no logprobs asked for, counts differences.
func TestBenchServeVerifyTellsNearTies(t *testing.T) {
	b := newCacheBackend()
	b.corrupt, b.tie = true, true
	url, path := serve(t, b), writeTestTrace(t, 40)
	for _, tc := range []struct {
		logprobs    int
		tol         float64
		ties, diffs int
	}{{5, 0.05, 20, 0}, {5, 0.005, 0, 20}, {0, 0.05, 0, 20}} {
		c := benchConfig(url, path)
		c.Concurrency, c.Verify, c.VerifyLogprobs, c.VerifyTolerance = 1, 2, tc.logprobs, tc.tol
		rep := runBench(t, c)
		v := rep.Verify
		if v == nil || v.Compared != 20 || v.Mismatches != 20 || v.Ties != tc.ties || v.Differences != tc.diffs {
			t.Fatalf("logprobs %d tolerance %g: verify %+v; want %d ties and %d differences", tc.logprobs, tc.tol, v, tc.ties, tc.diffs)
		}
		if tc.logprobs > 0 && v.MaxDrift != 0 {
			t.Errorf("drift %g: the tokens both chose have equal logprobs here", v.MaxDrift)
		}
	}
}

// TestBenchServeErrorsByStatus: refusals (429) and bad requests (400: prompt
// ids outside the server's vocabulary) are counted by status, and an
// absent server by transport.
func TestBenchServeErrorsByStatus(t *testing.T) {
	b := newCacheBackend()
	b.fullEvery = 4
	url := serve(t, b)
	path := writeTestTrace(t, 20)
	c := benchConfig(url, path)
	c.Concurrency = 1
	rep := runBench(t, c)
	if rep.Errors["429"] != 5 || rep.Completed != 15 || !strings.Contains(rep.ErrorSamples["429"], "queue is full") {
		t.Fatalf("errors %v %v, completed %d", rep.Errors, rep.ErrorSamples, rep.Completed)
	}
	c.Requests, c.Vocab = 3, 100000
	rep = runBench(t, c)
	if rep.Errors["400"] == 0 || !strings.Contains(rep.ErrorSamples["400"], "param prompt") {
		t.Fatalf("errors %v %v", rep.Errors, rep.ErrorSamples)
	}
	gone := httptest.NewServer(nil)
	gone.Close()
	c = benchConfig(gone.URL, path)
	c.Requests = 2
	if rep = runBench(t, c); rep.Errors["transport"] != 2 {
		t.Fatalf("a server that is not there: errors %v", rep.Errors)
	}
}

// TestBenchServeBounds: Requests stops the replay early, and Duration ends
// it, cancelling what is in flight.
func TestBenchServeBounds(t *testing.T) {
	path := writeTestTrace(t, 40)
	c := benchConfig(serve(t, newCacheBackend()), path)
	c.Requests = 7
	if rep := runBench(t, c); rep.Sent != 7 || rep.Completed != 7 {
		t.Fatalf("Requests 7: %+v", rep)
	}
	b := newCacheBackend()
	b.hold = true
	c = benchConfig(serve(t, b), path)
	c.Concurrency, c.Duration = 3, 100*time.Millisecond
	// The run ends by its Duration: the held requests are cancelled (a
	// run that ignored it would hang and hit the test's timeout).
	rep := runBench(t, c)
	if rep.Sent != 3 || rep.Cancelled != 3 || rep.Completed != 0 || len(rep.Errors) != 0 {
		t.Fatalf("Duration: %+v", rep)
	}
}

// TestBenchServeBundledTrace: the bundled Mooncake trace with blocks shrunk
// to 4 tokens and prompts cut to 200.
func TestBenchServeBundledTrace(t *testing.T) {
	c := benchserve.Config{URL: serve(t, newCacheBackend()) + "/", Timeout: time.Minute, Vocab: 256,
		Requests: 12, BlockTokens: 4, MaxTokens: 2, MaxPromptTokens: 200, Concurrency: 3}
	c.BundledTrace()
	rep := runBench(t, c)
	if rep.Completed != 12 || rep.Format != "mooncake" || rep.Trace != trace.BundledName || rep.CompletionTokens != 24 {
		t.Fatalf("%+v", rep)
	}
}

// TestBenchServeBadTraceSendsNothing: a malformed line anywhere in the
// part of the trace to be sent stops the run before the first request.
func TestBenchServeBadTraceSendsNothing(t *testing.T) {
	b := newCacheBackend()
	good, err := os.ReadFile(writeTestTrace(t, 30))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(path, append(good, "{\"arrival_us\":\"soon\"}\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = benchserve.Run(context.Background(), benchConfig(serve(t, b), path))
	var le *trace.LineError
	if !errors.As(err, &le) || le.Line != 31 {
		t.Fatalf("error %v, want a LineError at line 31", err)
	}
	if n := b.submits.Load(); n != 0 {
		t.Fatalf("the server got %d requests before the bad line was found", n)
	}
	// Requests that stop before the bad line send.
	c := benchConfig(serve(t, b), path)
	c.Requests = 30
	if rep := runBench(t, c); rep.Completed != 30 {
		t.Fatalf("%+v", rep)
	}
}
