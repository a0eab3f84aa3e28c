package benchserve

import (
	"strings"
	"testing"
	"time"

	"kvtier.dev/internal/openai"
)

// TestFitHandling: requests whose handling is 1.5 ms + 250 ns per prompt
// token, one of them slowed by 40 ms, fit that line exactly; a run
// without the server's timing is an error that says so.
func TestFitHandling(t *testing.T) {
	var r Report
	for i := range 15 {
		tokens := 1000 + 700*i
		h := 1.5e-3 + 250e-9*float64(tokens)
		if i == 7 {
			h += 40e-3
		}
		st := &openai.ServerTiming{QueueSeconds: 0.01 * float64(i), ForwardSeconds: 0.05}
		r.Requests = append(r.Requests, RequestRecord{PromptTokens: tokens, TTFTSeconds: h + st.QueueSeconds + st.ForwardSeconds, ServerTiming: st})
	}
	h, err := FitHandling(&r)
	if err != nil {
		t.Fatal(err)
	}
	if h.Requests != 15 || h.PerRequest.Round(time.Microsecond) != 1500*time.Microsecond || h.PerToken != 250*time.Nanosecond {
		t.Errorf("fit %+v, want 15 requests, 1.5ms + 250ns per token", h)
	}
	r.Requests = r.Requests[:1]
	if _, err := FitHandling(&r); err == nil || !strings.Contains(err.Error(), "1 requests with the server's timing") {
		t.Errorf("one request: err %v", err)
	}
}
