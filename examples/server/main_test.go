package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"kvtier.dev/examples/server/internal/engine"
	srvmodel "kvtier.dev/examples/server/internal/model"
	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/stack"
)

// testArgs are flags for a small server on the CPU backend: the tiny
// model, a GPU tier of 32 blocks of 4 tokens, host 64 and NVMe 512 blocks.
func testArgs(extra ...string) []string {
	return append([]string{"-addr", "127.0.0.1:0", "-device", "cpu", "-model", "tiny", "-context", "256",
		"-gpu-kv", "128KiB", "-host", "256KiB", "-nvme", "2MiB"}, extra...)
}

// server is one run of the server in the test's process.
type server struct {
	t    *testing.T
	url  string
	stop context.CancelFunc
	done chan error
	logs *logBuffer
}

// start runs the server with args until stop; it fails the test if the
// server does not come up.
func start(t *testing.T, args ...string) *server {
	t.Helper()
	return startWith(t, nil, args...)
}

// startWith is start, with set (if not nil) given the parsed config first.
func startWith(t *testing.T, set func(*config), args ...string) *server {
	t.Helper()
	c, err := parseArgs(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if set != nil {
		set(&c)
	}
	s := &server{t: t, done: make(chan error, 1), logs: &logBuffer{}}
	c.log = slog.New(slog.NewTextHandler(s.logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	up := make(chan string, 1)
	go func() { s.done <- run(ctx, &c, func(addr string) { up <- addr }) }()
	select {
	case addr := <-up:
		s.url = "http://" + addr
	case err := <-s.done:
		t.Fatalf("the server did not start: %v", err)
	}
	t.Cleanup(func() { s.shutdown() })
	return s
}

// shutdown stops the server as SIGTERM does and returns run's error.
func (s *server) shutdown() error {
	if s.stop == nil {
		return nil
	}
	s.stop()
	s.stop = nil
	select {
	case err := <-s.done:
		return err
	case <-time.After(60 * time.Second):
		s.t.Fatal("the server did not stop within 60s")
		return nil
	}
}

// logBuffer is the server's log, written by its goroutines and read by
// the test.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (s *server) complete(t *testing.T, req openai.CompletionRequest) *openai.Result {
	t.Helper()
	c := openai.Client{URL: s.url + openai.CompletionsPath}
	res, err := c.Complete(context.Background(), req)
	if err != nil {
		t.Fatalf("completion: %v", err)
	}
	return res
}

func tokenPrompt(seed, n int) openai.Prompt {
	p := openai.Prompt{IsTokens: true, Tokens: make([]int32, n)}
	for i := range p.Tokens {
		p.Tokens[i] = int32((seed*7919 + i*31) % 512)
	}
	return p
}

func maxTokens(n int) *int { return &n }

// TestServeEndToEnd: a prompt sent twice is answered with the same greedy
// tokens, the second time from the cache (usage says so), and so is its
// no-cache reference; a text prompt works; another tenant shares nothing.
// Also with the copy engine's device staging ring (-gather-staging).
func TestServeEndToEnd(t *testing.T) {
	t.Run("direct", func(t *testing.T) { serveEndToEnd(t, testArgs()...) })
	t.Run("gather-staging", func(t *testing.T) { serveEndToEnd(t, append(testArgs(), "-gather-staging", "3MiB")...) })
}

func serveEndToEnd(t *testing.T, args ...string) {
	s := start(t, args...)
	p := tokenPrompt(1, 41)
	first := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(6)})
	second := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(6)})
	ref := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(6), NoCache: true})
	other := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(6), User: "someone else"})
	if len(first.Tokens) != 6 || !slices.Equal(first.Tokens, second.Tokens) || !slices.Equal(first.Tokens, ref.Tokens) || !slices.Equal(first.Tokens, other.Tokens) {
		t.Fatalf("greedy tokens differ: first %v, cached %v, no-cache %v, other tenant %v", first.Tokens, second.Tokens, ref.Tokens, other.Tokens)
	}
	if c := first.Usage.PromptTokensDetails.CachedTokens; c != 0 {
		t.Errorf("first request: %d cached tokens, want 0", c)
	}
	// 41 tokens: the 10 full blocks before the last position's block.
	if c := second.Usage.PromptTokensDetails.CachedTokens; c != 40 {
		t.Errorf("second request: %d cached tokens, want 40", c)
	}
	if c := ref.Usage.PromptTokensDetails.CachedTokens; c != 0 {
		t.Errorf("no-cache request: %d cached tokens, want 0", c)
	}
	if c := other.Usage.PromptTokensDetails.CachedTokens; c != 0 {
		t.Errorf("another tenant's request: %d cached tokens, want 0 (salts must not share KV)", c)
	}
	// The server's timing: the forward passes are within the prefill,
	// which is within the client's TTFT with the queue.
	for name, r := range map[string]*openai.Result{"first": first, "cached": second, "no-cache": ref} {
		st := r.Usage.ServerTiming
		if st == nil || st.ForwardSeconds <= 0 || st.PrefillSeconds < st.ForwardSeconds || st.QueueSeconds < 0 ||
			st.QueueSeconds+st.PrefillSeconds > r.TTFT.Seconds() {
			t.Errorf("%s request: server timing %+v against a TTFT of %v", name, st, r.TTFT)
		}
	}
	// Logprobs: the greedy token is the most likely, cached or not, and
	// the CPU backend computes the cached prefix's KV bit for bit as the
	// reference does (same products): equal log-probabilities.
	lpCached := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(6), Logprobs: maxTokens(3)})
	lpRef := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(6), Logprobs: maxTokens(3), NoCache: true})
	for _, r := range []*openai.Result{lpCached, lpRef} {
		if len(r.Logprobs) != 6 || !slices.Equal(r.Tokens, first.Tokens) {
			t.Fatalf("with logprobs: tokens %v, %d logprobs; want %v and 6", r.Tokens, len(r.Logprobs), first.Tokens)
		}
		for i, lp := range r.Logprobs {
			if len(lp.Top) != 3 || lp.Top[0].ID != r.Tokens[i] || lp.Top[0].Logprob != lp.Logprob || lp.Logprob > 0 || lp.Top[1].Logprob > lp.Logprob {
				t.Fatalf("position %d: %+v; want the greedy token first among 3, log-probabilities at most 0 and falling", i, lp)
			}
		}
	}
	for i := range lpCached.Logprobs {
		if lpCached.Logprobs[i].Logprob != lpRef.Logprobs[i].Logprob {
			t.Errorf("position %d: cached logprob %g, reference %g", i, lpCached.Logprobs[i].Logprob, lpRef.Logprobs[i].Logprob)
		}
	}
	text := s.complete(t, openai.CompletionRequest{Prompt: openai.Prompt{Text: "Hello, kvtier! A text prompt of some length."}, MaxTokens: maxTokens(3)})
	if len(text.Tokens) != 3 || text.FinishReason != "length" {
		t.Errorf("text prompt: %d tokens, finish %q", len(text.Tokens), text.FinishReason)
	}
	if err := s.shutdown(); err != nil {
		t.Fatalf("shutdown: %v\n%s", err, s.logs)
	}
}

// TestServeBadRequests: 400 naming the field, and the server goes on.
func TestServeBadRequests(t *testing.T) {
	s := start(t, testArgs()...)
	long := tokenPrompt(2, 300)
	bodies := []struct{ body, param string }{
		{`{"max_tokens": 4}`, "prompt"},
		{`{"prompt": [1, 2, 99999]}`, "prompt"},
		{`{"prompt": "hi", "max_tokens": 0}`, "max_tokens"},
		{`{"prompt": "hi", "max_tokens": "four"}`, "max_tokens"},
		{`{"prompt": "hi", "temperature": 0.7}`, "temperature"},
		{`{"prompt": "hi", "max_tokens": 255}`, "max_tokens"},
		{`{"prompt": "hi"`, "body"},
	}
	lb, _ := json.Marshal(map[string]any{"prompt": long.Tokens})
	bodies = append(bodies, struct{ body, param string }{string(lb), "prompt"})
	for _, b := range bodies {
		resp, err := http.Post(s.url+openai.CompletionsPath, "application/json", strings.NewReader(b.body))
		if err != nil {
			t.Fatal(err)
		}
		var e openai.ErrorResponse
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != b.param {
			t.Errorf("%.40s: status %d, error %+v; want 400 naming %q", b.body, resp.StatusCode, e.Error, b.param)
		}
	}
	s.complete(t, openai.CompletionRequest{Prompt: tokenPrompt(3, 9), MaxTokens: maxTokens(2)})
}

// TestServeMetrics: /metrics parses as Prometheus text and has kvtier's
// and the server's series, with the requests counted.
func TestServeMetrics(t *testing.T) {
	s := start(t, testArgs()...)
	p := tokenPrompt(4, 33)
	s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(3)})
	s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(3)})
	fams := scrape(t, s.url)
	for _, name := range []string{"kvserve_ttft_seconds", "kvserve_inter_token_seconds", "kvserve_queue_depth",
		"kvserve_prefilled_tokens_total", "kvserve_loaded_tokens_total", "kvserve_loaded_bytes_total",
		"kvserve_recomputed_tokens_total", "kvserve_failed_loads_total", "kvserve_prefill_seconds", "kvtier_hits_total", "kvserve_mover_ops_total", "kvserve_mover_failures_total",
		"kvserve_nvme_checked_blocks_total", "kvserve_nvme_corrupt_blocks_total", "kvserve_copy_bytes_total", "kvserve_copy_transfers_total",
		"kvserve_pinned_bytes", "kvserve_pinned_registered_bytes", "kvserve_pinned_rate_gib_per_second"} {
		if fams[name] == nil {
			t.Errorf("/metrics has no %s", name)
		}
	}
	if h := fams["kvserve_ttft_seconds"]; h != nil && h.Metric[0].Histogram.GetSampleCount() != 2 {
		t.Errorf("kvserve_ttft_seconds counted %d requests, want 2", h.Metric[0].Histogram.GetSampleCount())
	}
	if got := counter(fams, "kvserve_loaded_tokens_total", "gpu"); got != 32 {
		t.Errorf("tokens loaded from the gpu tier: %v, want 32", got)
	}
}

// scrape reads /metrics with Prometheus's own text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse as Prometheus text: %v", err)
	}
	return fams
}

func counter(fams map[string]*dto.MetricFamily, name, tier string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	for _, m := range f.Metric {
		for _, l := range m.Label {
			if l.GetName() == "tier" && l.GetValue() == tier {
				return m.Counter.GetValue()
			}
		}
	}
	return -1
}

// TestServeDrainsOnShutdown: a request in flight when the server is told
// to stop gets all its tokens; run then returns nil (write-backs done, the
// NVMe store closed) and the port is closed.
func TestServeDrainsOnShutdown(t *testing.T) {
	s := start(t, testArgs()...)
	c := openai.Client{URL: s.url + openai.CompletionsPath}
	type answer struct {
		res *openai.Result
		err error
	}
	got := make(chan answer, 1)
	go func() {
		res, err := c.Complete(context.Background(), openai.CompletionRequest{Prompt: tokenPrompt(5, 60), MaxTokens: maxTokens(150)})
		got <- answer{res, err}
	}()
	// Stop once the request is being answered.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if inFlight(t, s.url) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the request never reached the server")
		}
		time.Sleep(time.Millisecond)
	}
	if err := s.shutdown(); err != nil {
		t.Fatalf("shutdown: %v\n%s", err, s.logs)
	}
	a := <-got
	if a.err != nil || len(a.res.Tokens) != 150 {
		t.Fatalf("the request in flight at shutdown: %v, %d tokens; want all 150", a.err, len(a.res.Tokens))
	}
	if _, err := http.Get(s.url + "/healthz"); err == nil {
		t.Error("the server still answers after shutdown")
	}
	if !strings.Contains(s.logs.String(), "stopped cleanly") {
		t.Errorf("no clean stop in the log:\n%s", s.logs)
	}
}

func inFlight(t *testing.T, url string) float64 {
	fams := scrape(t, url)
	if f := fams["kvserve_in_flight_requests"]; f != nil {
		return f.Metric[0].Gauge.GetValue()
	}
	return 0
}

// TestServeRestartAdoptsNVMe: a server over an NVMe directory stops; the
// next one over it adopts the blocks, answers the same prompts from the
// NVMe tier with identical tokens.
func TestServeRestartAdoptsNVMe(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kv")
	prompts := []openai.Prompt{tokenPrompt(6, 49), tokenPrompt(7, 37), tokenPrompt(8, 45)}
	first := serveAll(t, dir, prompts)
	second := serveAll(t, dir, prompts)
	nvmeHits := 0
	for i := range prompts {
		if !slices.Equal(first[i].Tokens, second[i].Tokens) {
			t.Errorf("prompt %d: tokens %v before the restart, %v after", i, first[i].Tokens, second[i].Tokens)
		}
		nvmeHits += second[i].Usage.PromptTokensDetails.CachedTokensByTier.NVMe
	}
	if nvmeHits == 0 {
		t.Error("after the restart no prompt token came from the NVMe tier")
	}
}

// serveAll starts a server over dir (with the extra flags), answers
// prompts once each (with their top 5 log-probabilities) and stops it
// cleanly.
func serveAll(t *testing.T, dir string, prompts []openai.Prompt, extra ...string) []*openai.Result {
	t.Helper()
	s := start(t, testArgs(append([]string{"-nvme-dir", dir}, extra...)...)...)
	var out []*openai.Result
	for _, p := range prompts {
		out = append(out, s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4), Logprobs: maxTokens(5)}))
	}
	if err := s.shutdown(); err != nil {
		t.Fatalf("shutdown: %v\n%s", err, s.logs)
	}
	return out
}

// TestServeCorruptNVMeIsRecomputed: every NVMe block is damaged between
// two runs; the second run's loads of them fail, the prompts are
// recomputed, the tokens and their log-probabilities are still those of
// the first run (no damaged byte reached a response), and the server keeps
// serving. With -layer-wait device the pass runs over the damaged blocks
// before the failure is seen, and is discarded; with host it ends at the
// first layer the failure reaches.
func TestServeCorruptNVMeIsRecomputed(t *testing.T) {
	for _, wait := range []string{"device", "host"} {
		t.Run(wait, func(t *testing.T) { testCorruptNVMe(t, "-layer-wait", wait) })
	}
}

func testCorruptNVMe(t *testing.T, flags ...string) {
	dir := filepath.Join(t.TempDir(), "kv")
	prompts := []openai.Prompt{tokenPrompt(9, 49), tokenPrompt(10, 41)}
	first := serveAll(t, dir, prompts)
	damageAll(t, dir)
	s := start(t, testArgs(append([]string{"-nvme-dir", dir}, flags...)...)...)
	for i, p := range prompts {
		r := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4), Logprobs: maxTokens(5)})
		if !slices.Equal(r.Tokens, first[i].Tokens) {
			t.Errorf("prompt %d after the damage: tokens %v, want %v", i, r.Tokens, first[i].Tokens)
		}
		if !reflect.DeepEqual(r.Logprobs, first[i].Logprobs) || len(r.Logprobs) != len(r.Tokens) {
			t.Errorf("prompt %d after the damage: log-probabilities %v, want %v", i, r.Logprobs, first[i].Logprobs)
		}
	}
	fams := scrape(t, s.url)
	failed := fams["kvserve_failed_loads_total"].Metric[0].Counter.GetValue()
	recomputed := fams["kvserve_recomputed_tokens_total"].Metric[0].Counter.GetValue()
	if failed == 0 || recomputed == 0 {
		t.Errorf("failed loads %v, recomputed tokens %v: want both above 0\n%s", failed, recomputed, s.logs)
	}
	if err := s.shutdown(); err != nil {
		t.Fatalf("shutdown after the damage: %v\n%s", err, s.logs)
	}
	if !strings.Contains(s.logs.String(), "last_failure=") {
		t.Errorf("the log at shutdown does not name the last failed copy:\n%s", s.logs)
	}
}

// testModel is the model identity a server started with args records in
// its tiers.
func testModel(t *testing.T, args ...string) string {
	t.Helper()
	id, _ := testIdentity(t, args...)
	return id.String()
}

// testIdentity is the model identity of a server started with args (the
// salts of its blocks: stack.Model.Salt) and its model's shape.
func testIdentity(t *testing.T, args ...string) (stack.Model, srvmodel.Config) {
	t.Helper()
	c, err := parseArgs(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.modelConfig()
	if err != nil {
		t.Fatal(err)
	}
	return modelIdentity(&c, m), m
}

// damageAll flips a byte in the payload of every slot of the store in dir.
func damageAll(t *testing.T, dir string) {
	t.Helper()
	st, err := nvme.Open(nvme.Config{Dirs: []string{dir}, SlotsPerFile: 512, BlockBytes: 4096, MaxTokens: 4, Model: testModel(t, testArgs()...)})
	if err != nil {
		t.Fatal(err)
	}
	info, kept := st.Info(), st.Len()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if kept == 0 {
		t.Fatal("the first run left no block on the drive")
	}
	f, err := os.OpenFile(info.Files[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range info.Slots {
		off := info.FirstSlotOffset + int64(i)*info.SlotBytes + int64(info.HeaderBytes) + 100
		var b [1]byte
		if _, err := f.ReadAt(b[:], off); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0x20
		if _, err := f.WriteAt(b[:], off); err != nil {
			t.Fatal(err)
		}
	}
}

func TestArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-strategy", "fastest"}, `-strategy: unknown strategy "fastest"`},
		{[]string{"-device", "tpu"}, `-device "tpu"`},
		{[]string{"-model", "gpt-9"}, `-model`},
		{[]string{"-policy", "mru"}, `-policy "mru"`},
		{[]string{"-max-queue", "0"}, `-max-queue 0`},
		{[]string{"-max-hole-blocks", "-1"}, `-max-hole-blocks -1`},
		{[]string{"-prefetch-blocks", "-1"}, `-prefetch-blocks -1`},
		{[]string{"-gather-staging", "-1"}, `invalid value "-1" for flag -gather-staging`},
		{[]string{"-warm-up=maybe"}, `invalid boolean value "maybe" for -warm-up`},
		{[]string{"-layer-wait", "gpu"}, `-layer-wait: engine: layer wait "gpu": want "device" or "host"`},
		{[]string{"-remote", "127.0.0.1:1", "-strategy", "gpu-only"}, `-remote with -strategy gpu-only`},
		{[]string{"-remote-prefix", ""}, `-remote-prefix is empty`},
		{[]string{"-remote-fetch-timeout", "0s"}, `-remote-fetch-timeout 0s: must be positive`},
		{[]string{"-remote-op-timeout", "-1s"}, `-remote-op-timeout -1s: must be positive`},
		{[]string{"-gpu-kv", "lots"}, `-gpu-kv`},
		{[]string{"-cost-calibration-out", "cal.json"}, `-cost-calibration-out: the cost model has no preset of tiny`},
		{[]string{"-model", "llama-3.1-8b", "-cost-learn=false", "-cost-calibration-out", "cal.json"}, `-cost-calibration-out with -cost-learn=false`},
		{[]string{"-nvme-admission", "often"}, `-nvme-admission "often"`},
		{[]string{"-nvme-writes", "some"}, `-nvme-writes "some"`},
		{[]string{"-nvme-write-share", "0"}, `-nvme-write-share 0`},
		{[]string{"-nvme-write-share", "2"}, `-nvme-write-share 2`},
		{[]string{"-nvme-dwpd", "-1"}, `-nvme-dwpd -1`},
		{[]string{"-nvme", "0", "-nvme-dir", "/tmp/kv"}, `-nvme 0 turns the NVMe tier off`},
		{[]string{"-nvme", "0", "-nvme-reformat"}, `-nvme-reformat has nothing to reformat`},
		{[]string{"-remote-user", "kvt"}, `-remote-user without -remote`},
		{[]string{"-remote-checksum-key-file", "k"}, `-remote-checksum-key-file without -remote`},
		{[]string{"-remote-tls"}, `-remote-tls without -remote`},
		{[]string{"-remote", "127.0.0.1:1", "-remote-tls-cert", "c.pem"}, `-remote-tls-cert and -remote-tls-key go together`},
	} {
		_, err := parseArgs(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error with %q", tc.args, err, tc.want)
		}
	}
	for _, w := range []struct {
		args []string
		want engine.LayerWait
	}{{nil, engine.LayerWaitDevice}, {[]string{"-layer-wait", "host"}, engine.LayerWaitHost}} {
		if c, err := parseArgs(w.args, io.Discard); err != nil || c.layerWait != w.want {
			t.Errorf("%v: layer wait %v (%v), want %v", w.args, c.layerWait, err, w.want)
		}
	}
	// tiny: 256 GPU blocks of 4 KiB, so an NVMe tier of 16 times that by default.
	for _, nv := range []struct {
		args []string
		want int64
	}{{nil, 16 << 20}, {[]string{"-nvme", "0"}, 0}, {[]string{"-nvme", "8MiB"}, 8 << 20}} {
		c, err := parseArgs(nv.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if sh, err := c.shape(); err != nil || sh.nvmeBytes != nv.want {
			t.Errorf("%v: NVMe tier of %d bytes (%v), want %d", nv.args, sh.nvmeBytes, err, nv.want)
		}
	}
	c, err := parseArgs([]string{"-model", "llama-3.1-8b", "-gpu-kv", "2GiB"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := c.shape()
	if err != nil || sh.model.BlockTokens != 16 || sh.cacheSlots != 1024 || sh.context != 16384 || sh.scratch != 2048 {
		t.Fatalf("llama-3.1-8b with -gpu-kv 2GiB: %+v, %v; want blocks of 16 tokens, 1024 cache slots, context 16384, 2048 scratch slots", sh, err)
	}
	k, err := openCalibration(&c, sh)
	if err != nil || k == nil || k.cal.Current().Prefill.Samples != 0 || k.observer() == nil {
		t.Fatalf("no -cost-calibration: %+v, %v; want the presets as the prior, learning", k, err)
	}
	c.costLearn = false
	if k, err := openCalibration(&c, sh); err != nil || k != nil {
		t.Fatalf("-cost-learn=false and no -cost-calibration: %+v, %v; want none (the presets, exact)", k, err)
	}
	cal := filepath.Join("..", "..", "benchmarks", "serve", "calibration", "h200-go-nvme-1.16GiBps.json")
	c, err = parseArgs([]string{"-model", "llama-3.1-8b", "-cost-calibration", cal, "-cost-learn=false"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if sh, err = c.shape(); err != nil {
		t.Fatal(err)
	}
	if k, err = openCalibration(&c, sh); err != nil {
		t.Fatal(err)
	}
	if k.observer() != nil {
		t.Error("-cost-learn=false: the engine would feed the calibration")
	}
	pc, err := plannerConfig(&c, sh)
	if err != nil {
		t.Fatal(err)
	}
	nvme, _ := k.cal.Current().Link(pc.Paths[cost.TierNVMe].Source)
	if want := 1.16 * (1 << 30); math.Abs(nvme.BandwidthBytesPerS-want) > 1 {
		t.Errorf("-cost-calibration %s: the NVMe link at %g bytes/s, want the file's %g", cal, nvme.BandwidthBytesPerS, want)
	}
	pc.Calibration = k.cal
	if _, err := cost.NewPlanner(pc); err != nil {
		t.Errorf("the planner refuses the calibration: %v", err)
	}
	for _, bad := range []string{filepath.Join(t.TempDir(), "absent.json"), "main.go"} {
		c.costCalibration = bad
		if _, err := openCalibration(&c, sh); err == nil || !strings.Contains(err.Error(), "-cost-calibration") {
			t.Errorf("-cost-calibration %s: %v; want an error naming the flag", bad, err)
		}
	}

	// What the engine reports reaches the fit, and -cost-calibration-out
	// writes it where the next start (and kvtier replay) read it.
	c.costCalibration, c.costLearn = "", true
	if k, err = openCalibration(&c, sh); err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		k.Pass(cost.PrefillSample{Tokens: 512 << (i % 4), Seconds: float64(int(20)<<(i%4)) / 1e3}, kvtier.GPU)
		k.Load(kvtier.Host, 64<<20, 1300*time.Microsecond)
		k.Load(kvtier.NVMe, 64<<20, time.Second) // two hops: not a sample
	}
	// Passes with loads: the host's teach the load slowdown, over the
	// host link; NVMe's are not taken.
	loaded := cost.PrefillSample{Prefix: 4096, Tokens: 1024, Seconds: 0.05, LoadBytes: 512 << 20, LoadBlocks: 256, LoadStartSeconds: -1e-4, LoadEndSeconds: 0.011}
	k.Pass(loaded, kvtier.Host)
	k.Pass(loaded, kvtier.NVMe)
	out := filepath.Join(t.TempDir(), "learned.json")
	if err := k.close(out); err != nil {
		t.Fatal(err)
	}
	back, err := cost.LoadCalibrationFile(out, pc.GPU, pc.Model)
	if err != nil {
		t.Fatal(err)
	}
	f := back.Current()
	host, _ := f.Link(pc.Paths[cost.TierHost].Ingress)
	if f.Prefill.Samples != 8 || len(f.Links) != 1 || host.BandwidthBytesPerS > 60e9 || host.BandwidthBytesPerS < 45e9 {
		t.Errorf("written calibration: %d prefill samples, links %+v; want 8 and the host link near 51.6 GB/s (64 MiB in 1.3 ms)", f.Prefill.Samples, f.Links)
	}
	var file struct {
		PrefillSamples []cost.PrefillSample `json:"prefill_samples"`
	}
	if b, err := os.ReadFile(out); err != nil || json.Unmarshal(b, &file) != nil {
		t.Fatalf("reading %s: %v", out, err)
	}
	var withLoads []cost.PrefillSample
	for _, s := range file.PrefillSamples {
		if s.LoadBytes > 0 {
			withLoads = append(withLoads, s)
		}
	}
	if len(withLoads) != 1 || withLoads[0].LoadLink != host.Name || withLoads[0].LoadBytes != loaded.LoadBytes {
		t.Errorf("written passes with loads: %+v; want the host's one, over %s", withLoads, host.Name)
	}
	c, err = parseArgs(testArgs("-context", "64", "-scratch", "16KiB"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.shape(); err == nil || !strings.Contains(err.Error(), "-scratch 16KiB") {
		t.Errorf("a scratch area smaller than one sequence: %v", err)
	}
}

// startErr runs a server with args and returns what stopped it: the error
// of a start that failed (nil if it served until 30 s had passed).
func startErr(t *testing.T, args []string) error {
	t.Helper()
	c, err := parseArgs(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c.log = slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return run(ctx, &c, nil)
}
