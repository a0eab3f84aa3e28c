package benchserve

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier/trace"
)

// TestPromptMaker: equal keys and salts give equal token runs, another
// salt or seed other runs; BlockTokens scales lengths and MaxPromptTokens
// cuts.
func TestPromptMaker(t *testing.T) {
	p := promptMaker{vocab: 1000}
	a := trace.Request{BlockTokens: 4, InputTokens: 10, Keys: []uint64{1, 2, 3}}
	b := trace.Request{BlockTokens: 4, InputTokens: 12, Keys: []uint64{1, 2, 9}}
	ta, _ := p.make(&a)
	tb, _ := p.make(&b)
	if len(ta) != 10 || len(tb) != 12 || !slices.Equal(ta[:8], tb[:8]) || slices.Equal(ta[8:], tb[8:10]) {
		t.Fatalf("a %v b %v", ta, tb)
	}
	for _, id := range tb {
		if id < 0 || id >= 1000 {
			t.Fatalf("id %d outside the vocabulary", id)
		}
	}
	salted := a
	salted.Salt = 5
	ts, _ := p.make(&salted)
	seeded := promptMaker{vocab: 1000, seed: 1}
	td, _ := seeded.make(&a)
	if slices.Equal(ts[:4], ta[:4]) || slices.Equal(td[:4], ta[:4]) {
		t.Fatal("another salt or seed gives the same tokens")
	}
	scaled := promptMaker{vocab: 1000, blockTokens: 2}
	if got, _ := scaled.make(&a); len(got) != 2+2+1 || !slices.Equal(got[:2], ta[:2]) {
		t.Fatalf("scaled to 2-token blocks: %v (from %v)", got, ta)
	}
	cut := promptMaker{vocab: 1000, maxTokens: 5}
	if got, was := cut.make(&a); len(got) != 5 || !was || !slices.Equal(got, ta[:5]) {
		t.Fatalf("cut to 5: %v %v", got, was)
	}
	if _, was := cut.make(&trace.Request{BlockTokens: 4, InputTokens: 5, Keys: []uint64{1, 2}}); was {
		t.Fatal("a prompt of exactly the limit counted as cut")
	}
	native := trace.Request{BlockTokens: 4, InputTokens: 3, Tokens: []int32{7, 8, 9}}
	if got, _ := p.make(&native); !slices.Equal(got, native.Tokens) {
		t.Fatalf("a trace's own tokens: %v", got)
	}
}

func TestPercentiles(t *testing.T) {
	ds := make([]time.Duration, 100)
	for i := range ds {
		ds[i] = time.Duration(i+1) * time.Millisecond
	}
	p, q := percentiles(ds)
	if p.P50 != 0.050 || p.P90 != 0.090 || p.P99 != 0.099 || p.Max != 0.100 || p.Mean != 0.0505 || len(q) != 101 || q[100] != 0.100 {
		t.Fatalf("%+v %v", p, q)
	}
	if p, q := percentiles(nil); p.P50 != 0 || q != nil {
		t.Fatalf("empty: %+v %v", p, q)
	}
}

func TestCompareAnswers(t *testing.T) {
	r := func(toks ...int32) *openai.Result { return &openai.Result{Tokens: toks, TokenCount: len(toks)} }
	if m, _ := compareAnswers(0, r(1, 2, 3), r(1, 2, 3), 0); m != nil {
		t.Fatalf("equal answers differ: %+v", m)
	}
	if m, _ := compareAnswers(4, r(1, 2, 3), r(1, 5, 3), 1); m == nil || m.Position != 1 || m.Request != 4 || m.Tie || m.Gap != -1 {
		t.Fatalf("no logprobs: %+v; want a difference, gap unknown", m)
	}
	if m, _ := compareAnswers(0, r(1, 2), r(1, 2, 3), 1); m == nil || m.Position != 2 || m.Tokens != 2 || m.RefTokens != 3 || m.Tie {
		t.Fatalf("a shorter answer: %+v", m)
	}
	// Without token ids the text is compared.
	if m, _ := compareAnswers(0, &openai.Result{Text: "abc"}, &openai.Result{Text: "abd"}, 1); m == nil || m.Position != 2 {
		t.Fatalf("text: %+v", m)
	}
	if m, _ := compareAnswers(0, &openai.Result{Text: "abc"}, &openai.Result{Text: "abc"}, 0); m != nil {
		t.Fatalf("equal text: %+v", m)
	}

	// With logprobs: position 0 agrees (drift 0.01), position 1 differs
	// (7 against 5).
	lp := func(own float64, top ...openai.TopLogprob) openai.TokenLogprob {
		return openai.TokenLogprob{Logprob: own, Top: top}
	}
	got, ref := r(1, 7), r(1, 5)
	got.Logprobs = []openai.TokenLogprob{lp(-1.00), lp(-2.00, openai.TopLogprob{ID: 7, Logprob: -2.00}, openai.TopLogprob{ID: 5, Logprob: -2.01})}
	ref.Logprobs = []openai.TokenLogprob{lp(-1.01), lp(-2.00, openai.TopLogprob{ID: 5, Logprob: -2.00}, openai.TopLogprob{ID: 7, Logprob: -2.03})}
	m, drift := compareAnswers(0, got, ref, 0.05)
	if m == nil || !m.Tie || math.Abs(m.Gap-0.03) > 1e-9 || math.Abs(drift-0.01) > 1e-9 {
		t.Fatalf("a near tie: %+v drift %g; want a tie of gap 0.03 and drift 0.01", m, drift)
	}
	if m, _ := compareAnswers(0, got, ref, 0.02); m == nil || m.Tie {
		t.Fatalf("a gap of 0.03 with tolerance 0.02: %+v; want a difference", m)
	}
	ref.Logprobs[1].Top = ref.Logprobs[1].Top[:1] // 7 not among the reference's top
	if m, _ := compareAnswers(0, got, ref, 1); m == nil || m.Tie || m.Gap != -1 {
		t.Fatalf("the other's token not listed: %+v; want a difference, gap unknown", m)
	}
}

// TestVerifyReportCounts: ties and differences are counted apart, the
// drift is the largest seen, and per-request records come back in trace
// order whatever order the answers came in.
func TestVerifyReportCounts(t *testing.T) {
	a := &Config{Verify: 1, VerifyLogprobs: 2, VerifyTolerance: 0.05, PerRequest: true}
	c := newCollector(a)
	res := &openai.Result{Tokens: []int32{1}, TokenCount: 1, TTFT: time.Millisecond,
		Usage: &openai.Usage{PromptTokensDetails: &openai.PromptTokensDetails{CachedTokens: 4, CachedTokensByTier: &openai.TierTokens{Host: 4}, RecomputedTokens: 2},
			ServerTiming: &openai.ServerTiming{QueueSeconds: 0.25, PrefillSeconds: 0.5, ForwardSeconds: 0.375}}}
	j := func(i int) *job { return &job{index: i, arrival: time.Duration(i) * time.Second} }
	longer, uncached := *res, *res
	longer.Usage = &openai.Usage{PromptTokensDetails: &openai.PromptTokensDetails{CachedTokens: 32}}
	uncached.Usage = nil
	c.add(j(2), outcome{res: res, verified: true, mismatch: &Mismatch{Tie: true, Gap: 0.01}, drift: 0.002, refTokens: 5})
	c.add(j(0), outcome{res: res, verified: true, mismatch: &Mismatch{Gap: -1}, drift: 0.004, refTokens: 7})
	c.add(j(1), outcome{res: &longer, verified: true, refTokens: 1})
	c.add(j(3), outcome{err: errors.New("refused")})
	v := c.verify
	if v.Compared != 3 || v.Mismatches != 2 || v.Ties != 1 || v.Differences != 1 || v.MaxDrift != 0.004 {
		t.Fatalf("%+v", v)
	}
	if v.Tokens != 13 || v.Agreement != 1.0/3 || v.AgreementWithTies != 2.0/3 ||
		v.Reused != 3 || v.CachedMin != 4 || v.CachedMax != 32 || v.ReusedAgree != 1 || v.ReusedTies != 1 || v.ReusedAgreement != 1.0/3 || v.ReusedAgreementWithTies != 2.0/3 {
		t.Fatalf("tokens %d, agreement %g (%g with ties); %d reused %d-%d, agreement %g (%g); want 13, 1/3 (2/3); 3 reused 4-32, 1/3 (2/3)",
			v.Tokens, v.Agreement, v.AgreementWithTies, v.Reused, v.CachedMin, v.CachedMax, v.ReusedAgreement, v.ReusedAgreementWithTies)
	}
	// An answer that reused nothing counts in the agreement, not among
	// the reused.
	c.add(j(4), outcome{res: &uncached, verified: true, refTokens: 2})
	if v.Compared != 4 || v.Agreement != 0.5 || v.Reused != 3 || v.ReusedAgreement != 1.0/3 || v.CachedMin != 4 {
		t.Fatalf("after an uncached answer: %+v", v)
	}
	rep := c.report(a, trace.NewReader(strings.NewReader(""), trace.Options{}), time.Second)
	if len(rep.Requests) != 5 {
		t.Fatalf("%d records", len(rep.Requests))
	}
	for i, r := range rep.Requests {
		if r.Index != i || r.ArrivalSeconds != float64(i) {
			t.Fatalf("record %d: %+v", i, r)
		}
	}
	if r := rep.Requests[0]; r.CachedTokens != 4 || r.ByTier.Host != 4 || r.RecomputedTokens != 2 || r.TTFTSeconds != 0.001 ||
		r.ServerTiming == nil || *r.ServerTiming != (openai.ServerTiming{QueueSeconds: 0.25, PrefillSeconds: 0.5, ForwardSeconds: 0.375}) {
		t.Errorf("record 0: %+v", r)
	}
	if r := rep.Requests[3]; r.Error != "refused" {
		t.Errorf("record 3: %+v", r)
	}
}

// TestTieGap: the near-tie rule on margins, as the codec accuracy
// experiment (examples/server/internal/kvdrift) applies it to logits.
func TestTieGap(t *testing.T) {
	for _, c := range []struct {
		got, ref, gap float64
		tie           bool
	}{
		{0.03, 0.01, 0.03, true},
		{0.01, 0.2, 0.2, false},
		{-0.001, 0.05, 0.05, true}, // a negative margin (rounding) counts as 0
		{-0.01, -0.02, 0, true},
		{0.1, 0, 0.1, true}, // the tolerance itself is a tie
	} {
		gap := TieGap(c.got, c.ref)
		if gap != c.gap || NearTie(gap, DefaultVerifyTolerance) != c.tie {
			t.Errorf("TieGap(%g, %g) = %g (tie %v), want %g (tie %v)", c.got, c.ref, gap, NearTie(gap, DefaultVerifyTolerance), c.gap, c.tie)
		}
	}
	if NearTie(-1, 1) {
		t.Error("an unknown gap (-1) is a near tie")
	}
}

func TestValidate(t *testing.T) {
	c := Config{URL: "http://127.0.0.1:1", Speed: 1, Timeout: time.Second, Vocab: 256}
	var ce *ConfigError
	if err := c.Validate(); !errors.As(err, &ce) || ce.Field != "trace" {
		t.Fatalf("no trace: %v", err)
	}
	c.BundledTrace()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Speed, c.Concurrency = 0, 2 // Speed is not used with Concurrency
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for raw, want := range map[string]string{
		"http://h:8":                  "http://h:8/v1/completions",
		"https://h/":                  "https://h/v1/completions",
		"http://h/v1/completions":     "http://h/v1/completions",
		"http://h/custom/completions": "http://h/custom/completions",
	} {
		if got, err := CompletionsURL(raw); err != nil || got != want {
			t.Errorf("%s: %s, %v; want %s", raw, got, err, want)
		}
	}
	if _, err := CompletionsURL("h:8"); err == nil || !strings.Contains(err.Error(), "http://") {
		t.Errorf("no scheme: %v", err)
	}
}

// TestServerTimingReport: the requests whose usage carried a server_timing
// are split into the server's queue, prefill and forward time and the
// handling left of their TTFT; one without is left out, and a run where
// none had it reports none.
func TestServerTimingReport(t *testing.T) {
	a := &Config{}
	c := newCollector(a)
	res := func(ttft time.Duration, st *openai.ServerTiming) outcome {
		return outcome{res: &openai.Result{Tokens: []int32{1}, TokenCount: 1, TTFT: ttft, Usage: &openai.Usage{ServerTiming: st}}}
	}
	j := func(i int) *job { return &job{index: i} }
	c.add(j(0), res(10*time.Millisecond, &openai.ServerTiming{QueueSeconds: 0.001, PrefillSeconds: 0.008, ForwardSeconds: 0.006}))
	c.add(j(1), res(20*time.Millisecond, &openai.ServerTiming{QueueSeconds: 0.002, PrefillSeconds: 0.016, ForwardSeconds: 0.012}))
	c.add(j(2), res(90*time.Millisecond, nil))
	rep := c.report(a, trace.NewReader(strings.NewReader(""), trace.Options{}), time.Second)
	st := rep.Server
	if st == nil || st.Requests != 2 {
		t.Fatalf("server timing %+v; want 2 requests", st)
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	if !near(st.Handling.Max, 0.006) || !near(st.Handling.Mean, 0.0045) || !near(st.Queue.Max, 0.002) ||
		!near(st.Prefill.Mean, 0.012) || !near(st.Forward.Max, 0.012) {
		t.Errorf("server timing %+v; want handling 3 and 6 ms, queue up to 2 ms, prefill 12 ms on average, forward up to 12 ms", st)
	}
	var txt strings.Builder
	if err := rep.WriteText(&txt); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"server queue", "server prefill", "server forward", "handling"} {
		if !strings.Contains(txt.String(), w) {
			t.Errorf("the report lacks %q:\n%s", w, txt.String())
		}
	}
	c = newCollector(a)
	c.add(j(0), res(10*time.Millisecond, nil))
	if rep := c.report(a, trace.NewReader(strings.NewReader(""), trace.Options{}), time.Second); rep.Server != nil {
		t.Errorf("no server timing sent, but the report has %+v", rep.Server)
	}
}
