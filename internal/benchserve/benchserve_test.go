package benchserve

import (
	"errors"
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
	if m := compareAnswers(0, r(1, 2, 3), r(1, 2, 3)); m != nil {
		t.Fatalf("equal answers differ: %+v", m)
	}
	if m := compareAnswers(4, r(1, 2, 3), r(1, 5, 3)); m == nil || m.Position != 1 || m.Request != 4 {
		t.Fatalf("%+v", m)
	}
	if m := compareAnswers(0, r(1, 2), r(1, 2, 3)); m == nil || m.Position != 2 || m.Tokens != 2 || m.RefTokens != 3 {
		t.Fatalf("a shorter answer: %+v", m)
	}
	// Without token ids the text is compared.
	if m := compareAnswers(0, &openai.Result{Text: "abc"}, &openai.Result{Text: "abd"}); m == nil || m.Position != 2 {
		t.Fatalf("text: %+v", m)
	}
	if m := compareAnswers(0, &openai.Result{Text: "abc"}, &openai.Result{Text: "abc"}); m != nil {
		t.Fatalf("equal text: %+v", m)
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
