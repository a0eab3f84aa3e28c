package httpapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"kvtier.dev/internal/openai"
)

// BenchmarkStreamedCompletion times the HTTP front's own cost: one streamed
// completion of a 512-token prompt and 16 generated tokens, over loopback,
// with an engine that answers at once (so what is timed is the request's
// decoding and checks, the handler, the SSE framing and the client's
// parsing). It reports the TTFT and inter-token gap the client saw.
func BenchmarkStreamedCompletion(b *testing.B) {
	be := newTestBackend()
	be.lim.ContextTokens = 4096
	a, err := New(Config{Backend: be})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(a)
	defer srv.Close()
	cl := openai.Client{URL: srv.URL + openai.CompletionsPath, HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	prompt := make([]int32, 512)
	for i := range prompt {
		prompt[i] = int32(i % 256)
	}
	mt := 16
	req := openai.CompletionRequest{Prompt: openai.TokenPrompt(prompt), MaxTokens: &mt}
	var ttft, itl float64
	var gaps int
	b.ReportAllocs()
	for b.Loop() {
		res, err := cl.Complete(context.Background(), req)
		if err != nil || res.TokenCount != mt {
			b.Fatal(res, err)
		}
		ttft += res.TTFT.Seconds()
		for _, g := range res.InterToken {
			itl += g.Seconds()
		}
		gaps += len(res.InterToken)
	}
	b.ReportMetric(ttft/float64(b.N)*1e6, "ttft-us")
	b.ReportMetric(itl/float64(max(gaps, 1))*1e6, "gap-us")
}
