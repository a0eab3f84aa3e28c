package httpapi

import (
	"context"
	"sync"
	"sync/atomic"

	"kvtier.dev/kvtier"
)

// testBackend is a stand-in engine for the API's tests: it "generates"
// token (sum of the prompt + i) mod vocab, reports the prompt's first
// cachedTokens tokens as loaded from the GPU and the next ones from the host,
// and can hold requests at a gate, refuse them (queue full), or fail them.
type testBackend struct {
	lim Limits
	// full makes Submit refuse with ErrQueueFull.
	full atomic.Bool
	// gate, when not nil, holds each request until it is closed (or the
	// request's context ends).
	gate chan struct{}
	// failAfter, when >= 0, fails each request after that many tokens.
	failAfter int
	// submitted receives each request as it is accepted, when not nil.
	submitted chan *Request

	mu      sync.Mutex
	queued  int
	ctxErrs int // requests that ended on their context
}

func newTestBackend() *testBackend {
	return &testBackend{lim: Limits{Model: "test-model", ContextTokens: 64, VocabSize: 512}, failAfter: -1}
}

func (b *testBackend) Limits() Limits { return b.lim }

func (b *testBackend) QueueDepth() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.queued
}

func (b *testBackend) Submit(ctx context.Context, req *Request, out *Stream) error {
	if b.full.Load() {
		return ErrQueueFull
	}
	b.mu.Lock()
	b.queued++
	b.mu.Unlock()
	if b.submitted != nil {
		b.submitted <- req
	}
	go b.run(ctx, req, out)
	return nil
}

func (b *testBackend) run(ctx context.Context, req *Request, out *Stream) {
	dequeue := func() {
		b.mu.Lock()
		b.queued--
		b.mu.Unlock()
	}
	if b.gate != nil {
		select {
		case <-b.gate:
		case <-ctx.Done():
			dequeue()
			b.mu.Lock()
			b.ctxErrs++
			b.mu.Unlock()
			out.Finish(Usage{}, ctx.Err())
			return
		}
	}
	dequeue()
	var sum int32
	for _, t := range req.Tokens {
		sum += t
	}
	for i := range req.MaxTokens {
		if i == b.failAfter {
			out.Finish(Usage{}, errTestEngine)
			return
		}
		tok := (sum + int32(i)) % int32(b.lim.VocabSize)
		if req.Logprobs {
			// The token, then the ids above it, each a nat less likely.
			lp := TokenLogprobs{Logprob: -0.5}
			for k := range req.TopLogprobs {
				lp.Top = append(lp.Top, TopToken{ID: (tok + int32(k)) % int32(b.lim.VocabSize), Logprob: -0.5 - float32(k)})
			}
			out.SendLogprobs(tok, lp)
			continue
		}
		out.Send(tok)
	}
	var u Usage
	gpu := min(len(req.Tokens), 2)
	host := min(len(req.Tokens)-gpu, 1)
	u.LoadedTokens[kvtier.GPU], u.LoadedTokens[kvtier.Host] = gpu, host
	u.LoadedBytes[kvtier.Host] = int64(host) * 1024
	u.RecomputedTokens = min(len(req.Tokens)-gpu-host, 1)
	out.Finish(u, nil)
}

type testEngineError struct{}

func (testEngineError) Error() string { return "the test engine failed" }

var errTestEngine error = testEngineError{}
