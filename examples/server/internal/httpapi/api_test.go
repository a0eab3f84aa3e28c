package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"kvtier.dev/internal/openai"
)

func newTestServer(t *testing.T, b *testBackend, cfg Config) (*API, *httptest.Server) {
	t.Helper()
	cfg.Backend = b
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return a, srv
}

func post(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url+openai.CompletionsPath, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// expectedTokens are the tokens testBackend generates for prompt.
func expectedTokens(prompt []int32, n, vocab int) []int32 {
	var sum int32
	for _, t := range prompt {
		sum += t
	}
	out := make([]int32, n)
	for i := range out {
		out[i] = (sum + int32(i)) % int32(vocab)
	}
	return out
}

func TestCompletionWhole(t *testing.T) {
	b := newTestBackend()
	_, srv := newTestServer(t, b, Config{})
	resp, body := post(t, srv.URL, `{"model":"test-model","prompt":"hello","max_tokens":4,"user":"u1"}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var cr openai.CompletionResponse
	if err := json.Unmarshal(body, &cr); err != nil {
		t.Fatal(err)
	}
	want := expectedTokens(openai.AppendBytesAsTokens(nil, "hello"), 4, 512)
	if len(cr.Choices) != 1 || !slicesEqual(cr.Choices[0].TokenIDs, want) || *cr.Choices[0].FinishReason != "length" {
		t.Fatalf("choices %+v, want tokens %v", cr.Choices, want)
	}
	u := cr.Usage
	d := u.PromptTokensDetails
	if u.PromptTokens != 5 || u.CompletionTokens != 4 || u.TotalTokens != 9 || d.CachedTokens != 3 ||
		*d.CachedTokensByTier != (openai.TierTokens{GPU: 2, Host: 1}) || d.RecomputedTokens != 1 {
		t.Fatalf("usage %+v details %+v by tier %+v", u, d, d.CachedTokensByTier)
	}
	if cr.Model != "test-model" || !strings.HasPrefix(cr.ID, "cmpl-") || cr.Object != "text_completion" {
		t.Fatalf("header fields %+v", cr)
	}
}

// TestCompletionLogprobs: logprobs asked for come back per token, in
// OpenAI's form and by id, whole and streamed (read through openai.Client,
// as bench-serve reads them); not asked for, there are none.
func TestCompletionLogprobs(t *testing.T) {
	b := newTestBackend()
	_, srv := newTestServer(t, b, Config{})
	resp, body := post(t, srv.URL, `{"prompt":[1,2,300],"max_tokens":3,"logprobs":2}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var cr openai.CompletionResponse
	if err := json.Unmarshal(body, &cr); err != nil {
		t.Fatal(err)
	}
	want := expectedTokens([]int32{1, 2, 300}, 3, 512)
	lp := cr.Choices[0].Logprobs
	if lp == nil || len(lp.TokenLogprobs) != 3 || len(lp.TopTokenIDs) != 3 || len(lp.TopLogprobs) != 3 || len(lp.TextOffset) != 3 {
		t.Fatalf("logprobs %+v: want 3 positions", lp)
	}
	for i, tok := range want {
		if lp.TokenLogprobs[i] != -0.5 || !slicesEqual(lp.TopTokenIDs[i], []int32{tok, (tok + 1) % 512}) ||
			lp.TopTokenLogprobs[i][0] != -0.5 || lp.TopTokenLogprobs[i][1] != -1.5 || lp.TextOffset[i] != len(cr.Choices[0].Text[:lp.TextOffset[i]]) {
			t.Errorf("position %d: %v %v %v", i, lp.TokenLogprobs[i], lp.TopTokenIDs[i], lp.TopTokenLogprobs[i])
		}
	}
	if _, body := post(t, srv.URL, `{"prompt":[1,2,300],"max_tokens":3}`); bytes.Contains(body, []byte("logprobs")) {
		t.Errorf("logprobs not asked for, yet sent: %s", body)
	}

	client := &openai.Client{URL: srv.URL + openai.CompletionsPath}
	two := 2
	res, err := client.Complete(context.Background(), openai.CompletionRequest{Prompt: openai.TokenPrompt([]int32{1, 2, 300}), MaxTokens: &two, Logprobs: &two})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Logprobs) != 2 || res.Logprobs[1].Logprob != -0.5 || len(res.Logprobs[1].Top) != 2 ||
		res.Logprobs[1].Top[1] != (openai.TopLogprob{ID: (want[1] + 1) % 512, Logprob: -1.5}) {
		t.Fatalf("streamed logprobs %+v", res.Logprobs)
	}
}

// TestCompletionTokenPromptAndSalt: a token-id prompt reaches the engine as
// is, with max_tokens defaulting to Config.DefaultMaxTokens, and user/salt
// give the engine different salts (empty: salt 0).
func TestCompletionTokenPromptAndSalt(t *testing.T) {
	b := newTestBackend()
	b.submitted = make(chan *Request, 4)
	_, srv := newTestServer(t, b, Config{DefaultMaxTokens: 3})
	var salts []uint64
	for _, tenant := range []string{``, `,"user":"a"`, `,"salt":"a"`, `,"user":"a","salt":"x","no_cache":true`} {
		resp, body := post(t, srv.URL, `{"prompt":[1,2,300]`+tenant+`}`)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d: %s", tenant, resp.StatusCode, body)
		}
		r := <-b.submitted
		if !slicesEqual(r.Tokens, []int32{1, 2, 300}) || r.MaxTokens != 3 {
			t.Fatalf("engine got %+v", r)
		}
		if r.NoCache != strings.Contains(tenant, "no_cache") {
			t.Fatalf("%s: NoCache %v", tenant, r.NoCache)
		}
		salts = append(salts, uint64(r.Salt))
	}
	if salts[0] != 0 || salts[1] == salts[2] || salts[1] == 0 || salts[2] == 0 || salts[3] == salts[1] {
		t.Fatalf("salts %v: want 0 for no tenant, and distinct ones", salts)
	}
}

func slicesEqual(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCompletionStreamFraming reads a streamed response byte by byte: each
// event is one "data: " line and a blank line, one token per chunk, then a
// chunk with the finish reason, the usage chunk, and [DONE].
func TestCompletionStreamFraming(t *testing.T) {
	b := newTestBackend()
	_, srv := newTestServer(t, b, Config{})
	resp, body := post(t, srv.URL, `{"prompt":"a\"\\\n","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if !bytes.HasSuffix(body, []byte("\n\ndata: [DONE]\n\n")) {
		t.Fatalf("stream does not end with [DONE]: %q", body)
	}
	events := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
	if len(events) != 3+1+1+1 {
		t.Fatalf("%d events, want 6: %q", len(events), body)
	}
	prompt := openai.AppendBytesAsTokens(nil, "a\"\\\n")
	want := expectedTokens(prompt, 3, 512)
	for i, ev := range events[:5] {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("event %d is not one data line: %q", i, ev)
		}
		var c openai.CompletionResponse
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("event %d: %v: %s", i, err, data)
		}
		switch {
		case i < 3:
			ch := c.Choices[0]
			if len(ch.TokenIDs) != 1 || ch.TokenIDs[0] != want[i] || ch.FinishReason != nil || c.Usage != nil {
				t.Fatalf("token chunk %d: %s", i, data)
			}
			if wantText := string(openai.AppendTokenText(nil, want[i])); wantText != ch.Text && ch.Text != "\ufffd" {
				t.Fatalf("token chunk %d text %q, want %q", i, ch.Text, wantText)
			}
		case i == 3:
			if len(c.Choices) != 1 || c.Choices[0].FinishReason == nil || *c.Choices[0].FinishReason != "length" {
				t.Fatalf("finish chunk: %s", data)
			}
		case i == 4:
			if len(c.Choices) != 0 || c.Usage == nil || c.Usage.PromptTokens != len(prompt) || c.Usage.CompletionTokens != 3 {
				t.Fatalf("usage chunk: %s", data)
			}
		}
	}

	// The package's own client reads the same stream.
	cl := openai.Client{URL: srv.URL + openai.CompletionsPath}
	mt := 5
	res, err := cl.Complete(context.Background(), openai.CompletionRequest{Prompt: openai.TokenPrompt(prompt), MaxTokens: &mt})
	if err != nil {
		t.Fatal(err)
	}
	if !slicesEqual(res.Tokens, expectedTokens(prompt, 5, 512)) || res.TokenCount != 5 || len(res.InterToken) != 4 ||
		res.FinishReason != "length" || res.Usage == nil || res.TTFT <= 0 || res.Latency < res.TTFT {
		t.Fatalf("client result %+v", res)
	}
}

// TestBadRequests: each malformed request gets 400 whose param names the
// field, and never reaches the engine.
func TestBadRequests(t *testing.T) {
	b := newTestBackend()
	b.submitted = make(chan *Request, 1)
	_, srv := newTestServer(t, b, Config{})
	long := make([]string, 65)
	for i := range long {
		long[i] = "1"
	}
	cases := []struct{ body, param, msg string }{
		{`{"prompt":`, "body", "invalid JSON"},
		{``, "body", "empty"},
		{`{"prompt":"x"} {}`, "body", "more after"},
		{`[1]`, "body", "want a JSON object"},
		{`{"max_tokens":3}`, "prompt", "missing"},
		{`{"prompt":""}`, "prompt", "missing"},
		{`{"prompt":[]}`, "prompt", "missing"},
		{`{"prompt":null}`, "prompt", "null"},
		{`{"prompt":7}`, "prompt", "want a string"},
		{`{"prompt":["a","b"]}`, "prompt", "batches"},
		{`{"prompt":[[1,2]]}`, "prompt", "batches"},
		{`{"prompt":[1,-2]}`, "prompt", "token 1"},
		{`{"prompt":[1,2.5]}`, "prompt", "token 1"},
		{`{"prompt":[1,512]}`, "prompt", "vocabulary of 512"},
		{`{"prompt":[` + strings.Join(long, ",") + `]}`, "prompt", "longer than the model's context of 64"},
		{`{"prompt":[1,2],"max_tokens":63}`, "max_tokens", "exceed the model's context"},
		{`{"prompt":"x","max_tokens":"many"}`, "max_tokens", "want int"},
		{`{"prompt":"x","max_tokens":0}`, "max_tokens", "at least 1"},
		{`{"prompt":"x","max_tokens":9223372036854775807}`, "max_tokens", "exceed the model's context"},
		{`{"prompt":[1,2,3],"max_tokens":9223372036854775806}`, "max_tokens", "exceed the model's context"},
		{`{"prompt":"x","max_tokens":9223372036854775808}`, "max_tokens", "want int"},
		{`{"prompt":"x","max_tokens":-4}`, "max_tokens", "at least 1"},
		{`{"prompt":"x","temperature":0.7}`, "temperature", "greedy"},
		{`{"prompt":"x","n":2}`, "n", "one choice"},
		{`{"prompt":"x","stream":"yes"}`, "stream", "want bool"},
		{`{"prompt":"x","user":5}`, "user", "want string"},
		{`{"prompt":"x","model":"other"}`, "model", "serves \"test-model\""},
		{`{"prompt":"x","logprobs":-1}`, "logprobs", "want 0 to 20"},
		{`{"prompt":"x","logprobs":21}`, "logprobs", "want 0 to 20"},
		{`{"prompt":"x","logprobs":"all"}`, "logprobs", "want int"},
	}
	for _, c := range cases {
		resp, body := post(t, srv.URL, c.body)
		if resp.StatusCode != 400 {
			t.Errorf("%s: status %d: %s", c.body, resp.StatusCode, body)
			continue
		}
		var e openai.ErrorResponse
		if err := json.Unmarshal(body, &e); err != nil {
			t.Errorf("%s: %v: %s", c.body, err, body)
			continue
		}
		param := ""
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		if param != c.param || !strings.Contains(e.Error.Message, c.msg) || e.Error.Type != openai.ErrInvalidRequest {
			t.Errorf("%s: param %q message %q, want param %q and %q", c.body, param, e.Error.Message, c.param, c.msg)
		}
	}
	select {
	case r := <-b.submitted:
		t.Fatalf("a bad request reached the engine: %+v", r)
	default:
	}
	// The temperature 0 of greedy clients and n 1 are accepted.
	if resp, body := post(t, srv.URL, `{"prompt":"x","temperature":0,"n":1,"max_tokens":1}`); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
}

func TestBodyTooLarge(t *testing.T) {
	_, srv := newTestServer(t, newTestBackend(), Config{MaxBodyBytes: 64})
	resp, body := post(t, srv.URL, `{"prompt":"`+strings.Repeat("x", 100)+`"}`)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), "over 64 bytes") {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
}

func TestQueueFull(t *testing.T) {
	b := newTestBackend()
	b.full.Store(true)
	_, srv := newTestServer(t, b, Config{})
	resp, body := post(t, srv.URL, `{"prompt":"x","stream":true}`)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" ||
		!strings.Contains(string(body), openai.ErrRateLimit) {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	cl := openai.Client{URL: srv.URL + openai.CompletionsPath}
	if _, err := cl.Complete(context.Background(), openai.CompletionRequest{Prompt: openai.TextPrompt("x")}); !openai.IsStatus(err, 429) {
		t.Fatalf("client error %v, want status 429", err)
	}
}

// TestEngineFailure: an engine that fails before the first token gives
// 500; one that fails after it ends the stream with an error event.
func TestEngineFailure(t *testing.T) {
	b := newTestBackend()
	b.failAfter = 0
	_, srv := newTestServer(t, b, Config{})
	for _, stream := range []string{"false", "true"} {
		resp, body := post(t, srv.URL, `{"prompt":"x","stream":`+stream+`}`)
		if resp.StatusCode != 500 || !strings.Contains(string(body), "the test engine failed") {
			t.Fatalf("stream %s: status %d: %s", stream, resp.StatusCode, body)
		}
	}
	b.failAfter = 2
	cl := openai.Client{URL: srv.URL + openai.CompletionsPath}
	_, err := cl.Complete(context.Background(), openai.CompletionRequest{Prompt: openai.TextPrompt("x")})
	var se *openai.StatusError
	if !errors.As(err, &se) || !se.InStream || !strings.Contains(se.Message, "the test engine failed") {
		t.Fatalf("client error %v, want an error event", err)
	}
}

// TestDrain: once Drain begins, new requests get 503 and /healthz says
// draining; Drain returns when the request in flight has been answered,
// and it is answered in full.
func TestDrain(t *testing.T) {
	b := newTestBackend()
	b.gate = make(chan struct{})
	b.submitted = make(chan *Request, 1)
	a, srv := newTestServer(t, b, Config{})
	type answer struct {
		res *openai.Result
		err error
	}
	done := make(chan answer, 1)
	cl := openai.Client{URL: srv.URL + openai.CompletionsPath}
	go func() {
		mt := 4
		res, err := cl.Complete(context.Background(), openai.CompletionRequest{Prompt: openai.TextPrompt("in flight"), MaxTokens: &mt})
		done <- answer{res, err}
	}()
	<-b.submitted
	drained := make(chan error, 1)
	go func() { drained <- a.Drain(context.Background()) }()
	// Wait for the drain to begin (healthz turns), with a deadline.
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(srv.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("healthz never said draining")
		}
		time.Sleep(time.Millisecond)
	}
	if resp, body := post(t, srv.URL, `{"prompt":"late"}`); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a request during the drain got %d: %s", resp.StatusCode, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := a.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 requests still in flight") {
		t.Fatalf("Drain with a request held: %v", err)
	}
	select {
	case err := <-drained:
		t.Fatalf("Drain returned %v with a request in flight", err)
	default:
	}
	close(b.gate)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	ans := <-done
	if ans.err != nil || ans.res.TokenCount != 4 {
		t.Fatalf("the request in flight: %+v, %v", ans.res, ans.err)
	}
}

// TestClientGone: a client that leaves mid-request cancels the engine's
// context, and the request is counted as canceled, not as an error.
func TestClientGone(t *testing.T) {
	b := newTestBackend()
	b.gate = make(chan struct{})
	b.submitted = make(chan *Request, 1)
	a, srv := newTestServer(t, b, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		cl := openai.Client{URL: srv.URL + openai.CompletionsPath}
		_, err := cl.Complete(ctx, openai.CompletionRequest{Prompt: openai.TextPrompt("x")})
		errc <- err
	}()
	<-b.submitted
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error %v", err)
	}
	if err := a.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	ctxErrs := b.ctxErrs
	b.mu.Unlock()
	fams := scrape(t, srv.URL)
	if ctxErrs != 1 || counterValue(t, fams, "kvserve_requests_total", "code", "canceled") != 1 {
		t.Fatalf("engine saw %d cancellations; metrics %v", ctxErrs, fams["kvserve_requests_total"])
	}
}

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

// counterValue returns the value of name's series whose label is value
// (any series when label is "").
func counterValue(t *testing.T, fams map[string]*dto.MetricFamily, name, label, value string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	for _, m := range f.Metric {
		for _, l := range m.Label {
			if l.GetName() == label && l.GetValue() == value {
				if m.Counter != nil {
					return m.Counter.GetValue()
				}
				return m.Gauge.GetValue()
			}
		}
		if label == "" {
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

// TestMetrics: after some requests, /metrics parses as Prometheus text and
// counts them: codes, TTFT and inter-token observations, tokens by source
// and tier, queue depth.
func TestMetrics(t *testing.T) {
	b := newTestBackend()
	_, srv := newTestServer(t, b, Config{})
	for range 3 {
		if resp, body := post(t, srv.URL, `{"prompt":"hello","max_tokens":4,"stream":true}`); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	post(t, srv.URL, `{"prompt":"hello","max_tokens":0}`)
	b.full.Store(true)
	post(t, srv.URL, `{"prompt":"hello"}`)
	fams := scrape(t, srv.URL)
	checks := []struct {
		name, label, value string
		want               float64
	}{
		{"kvserve_requests_total", "code", "200", 3},
		{"kvserve_requests_total", "code", "400", 1},
		{"kvserve_requests_total", "code", "429", 1},
		{"kvserve_loaded_tokens_total", "tier", "gpu", 6},
		{"kvserve_loaded_tokens_total", "tier", "host", 3},
		{"kvserve_loaded_tokens_total", "tier", "nvme", 0},
		{"kvserve_loaded_bytes_total", "tier", "host", 3 * 1024},
		{"kvserve_prefilled_tokens_total", "", "", 6},
		{"kvserve_recomputed_tokens_total", "", "", 3},
		{"kvserve_generated_tokens_total", "", "", 12},
		{"kvserve_queue_depth", "", "", 0},
		{"kvserve_in_flight_requests", "", "", 0},
	}
	for _, c := range checks {
		if got := counterValue(t, fams, c.name, c.label, c.value); got != c.want {
			t.Errorf("%s{%s=%q} = %g, want %g", c.name, c.label, c.value, got, c.want)
		}
	}
	if h := fams["kvserve_ttft_seconds"].Metric[0].Histogram; h.GetSampleCount() != 3 {
		t.Errorf("ttft observations %d, want 3", h.GetSampleCount())
	}
	if h := fams["kvserve_inter_token_seconds"].Metric[0].Histogram; h.GetSampleCount() != 9 {
		t.Errorf("inter-token observations %d, want 9", h.GetSampleCount())
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics in the default registry")
	}
	if _, ok := fams["process_resident_memory_bytes"]; !ok && runtime.GOOS == "linux" {
		t.Error("no process metrics in the default registry")
	}
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("healthz %d", resp.StatusCode)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	b := newTestBackend()
	b.lim.ContextTokens = 1
	if _, err := New(Config{Backend: b}); err == nil || !strings.Contains(err.Error(), "ContextTokens 1") {
		t.Errorf("ContextTokens 1: %v", err)
	}
	b = newTestBackend()
	b.lim.VocabSize = 0
	if _, err := New(Config{Backend: b}); err == nil || !strings.Contains(err.Error(), "VocabSize 0") {
		t.Errorf("VocabSize 0: %v", err)
	}
	if _, err := New(Config{Backend: newTestBackend(), DefaultMaxTokens: -1}); err == nil || !strings.Contains(err.Error(), "DefaultMaxTokens") {
		t.Errorf("DefaultMaxTokens -1: %v", err)
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{MaxBodyBytes: -1}, "MaxBodyBytes -1"}, {Config{MaxDecodes: -1}, "MaxDecodes -1"},
		{Config{BodyTimeout: -time.Second}, "BodyTimeout -1s"}, {Config{WriteTimeout: -time.Second}, "WriteTimeout -1s"},
	} {
		c.cfg.Backend = newTestBackend()
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "Backend is nil") {
		t.Errorf("no backend: %v", err)
	}
}

func TestTextPromptNeedsByteVocab(t *testing.T) {
	b := newTestBackend()
	b.lim.VocabSize = 100
	_, srv := newTestServer(t, b, Config{})
	resp, body := post(t, srv.URL, `{"prompt":"x"}`)
	if resp.StatusCode != 400 || !strings.Contains(string(body), "send token ids") {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
}

func TestStreamSendBeyondMaxTokensPanics(t *testing.T) {
	s := NewStream(1)
	s.Send(1)
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	s.Send(2)
}

// TestAppendJSONString: the hand-written string encoder of the stream's
// chunks decodes to what encoding/json's does, for random bytes.
func TestAppendJSONString(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		s := make([]byte, r.IntN(8))
		for j := range s {
			s[j] = byte(r.IntN(256))
		}
		if i < 256 {
			s = []byte{byte(i)}
		}
		var got, want string
		enc := appendJSONString(nil, s)
		if err := json.Unmarshal(enc, &got); err != nil {
			t.Fatalf("%q encodes to invalid JSON %s: %v", s, enc, err)
		}
		ref, _ := json.Marshal(string(s))
		json.Unmarshal(ref, &want)
		if got != want {
			t.Fatalf("%q: got %q, want %q", s, got, want)
		}
	}
}
