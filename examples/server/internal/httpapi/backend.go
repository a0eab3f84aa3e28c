package httpapi

import (
	"context"
	"errors"
	"time"

	"kvtier.dev/internal/invariants"
	"kvtier.dev/kvtier"
)

// Backend is the model engine behind the API: a continuous-batching engine
// that queues requests, prefills them in arrival order and decodes them in
// a batch, sending each request's tokens as they are sampled.
type Backend interface {
	// Limits returns the model's limits; the API checks requests against
	// them before Submit. They MUST NOT change while the API runs.
	Limits() Limits
	// Submit queues req and returns at once, without waiting for the model.
	// On nil, the engine owns req and out: it MUST call out.Send for each
	// generated token (at most req.MaxTokens times) and then out.Finish
	// exactly once, also when ctx is cancelled (the client went away: stop
	// early and Finish with ctx.Err()). On an error, it MUST NOT touch out;
	// ErrQueueFull (or an error wrapping it) makes the API answer 429.
	Submit(ctx context.Context, req *Request, out *Stream) error
	// QueueDepth returns the number of requests waiting to prefill.
	QueueDepth() int
}

// Limits are a model's limits, as the API checks requests against them.
type Limits struct {
	// Model is the model's name, echoed in responses.
	Model string
	// ContextTokens is the most tokens a sequence may hold: prompt plus
	// max_tokens. For example 131072 for llama-3.1-8b.
	ContextTokens int
	// VocabSize is the number of token ids: a prompt id must be below it.
	// Text prompts (byte-level tokens) need at least openai.ByteVocab.
	VocabSize int
}

// ErrQueueFull is returned by Backend.Submit when the engine queues no more
// requests; the client gets 429 and may retry.
var ErrQueueFull = errors.New("the request queue is full")

// Request is one completion as the engine sees it.
type Request struct {
	// ID names the request in logs and responses ("cmpl-…").
	ID string
	// Tokens is the prompt, 1 to Limits.ContextTokens-MaxTokens ids. The
	// engine MUST NOT modify it.
	Tokens []int32
	// MaxTokens is the most tokens to generate, at least 1.
	MaxTokens int
	// Salt is the tenant's kvtier salt (openai.SaltOf of user and salt):
	// KV is never shared across salts.
	Salt kvtier.Salt
	// NoCache asks the engine to neither look up nor insert this request's
	// blocks: a reference run that computes everything.
	NoCache bool
	// Arrival is when the request reached the server; engines prefill in
	// arrival order.
	Arrival time.Time
	// Logprobs asks for each generated token's log-probability and the
	// TopLogprobs most likely tokens at its position (Stream.SendLogprobs;
	// TopLogprobs at most openai.MaxLogprobs, 0 for the token's alone).
	Logprobs    bool
	TopLogprobs int
}

// TokenLogprobs is one generated token's log-probability (natural log,
// under the model's softmax) and the most likely tokens at its position,
// most likely first.
type TokenLogprobs struct {
	Logprob float32
	Top     []TopToken
}

// TopToken is one of the most likely tokens at a position.
type TopToken struct {
	ID      int32
	Logprob float32
}

// Usage is what the engine reports for one finished request: where its
// prompt's KV came from.
type Usage struct {
	// LoadedTokens are prompt tokens whose KV was loaded from (or found in)
	// each tier instead of computed, indexed by kvtier.Tier. Their sum is
	// at most len(Request.Tokens); the rest was prefilled.
	LoadedTokens [kvtier.NumTiers]int
	// LoadedBytes are the KV bytes read from each tier for this request
	// (zero for blocks already on the GPU, which move nothing).
	LoadedBytes [kvtier.NumTiers]int64
	// RecomputedTokens are prefilled prompt tokens whose KV a tier held but
	// the engine computed anyway (cheaper, or the load failed).
	RecomputedTokens int
	// Where the time to the first token went in the engine: QueueSeconds
	// from the engine's Submit (the request parsed) to the start of the
	// prefill (its lookup), PrefillSeconds from there to the first token,
	// ForwardSeconds the forward passes within it (waits for layers
	// loading included). What a client's TTFT has beyond QueueSeconds +
	// ForwardSeconds is the request's handling: HTTP, parsing, the
	// cache's bookkeeping. SpaceWaitSeconds is the prefill's wait for
	// copies out of the GPU to free the slots of the blocks it computes.
	QueueSeconds, PrefillSeconds, ForwardSeconds, SpaceWaitSeconds float64
}

// CachedTokens returns the prompt tokens whose KV was loaded, all tiers.
func (u *Usage) CachedTokens() int {
	n := 0
	for _, t := range u.LoadedTokens {
		n += t
	}
	return n
}

// Stream carries one request's tokens from the engine to the HTTP handler.
// Send never blocks: the stream buffers up to the request's MaxTokens, so a
// slow client never stalls the engine's batch.
type Stream struct {
	tokens chan int32
	// logprobs[i] is token i's, when the request asked for them: written
	// by SendLogprobs before the token is sent, read after it is received.
	logprobs []TokenLogprobs
	sent     int
	usage    Usage
	err      error
}

// NewStream returns a stream for up to maxTokens tokens. The API makes one
// per request; engines' own tests make them too.
func NewStream(maxTokens int) *Stream {
	return &Stream{tokens: make(chan int32, maxTokens)}
}

// NewLogprobsStream returns a stream for up to maxTokens tokens that also
// carries their log-probabilities (SendLogprobs).
func NewLogprobsStream(maxTokens int) *Stream {
	s := NewStream(maxTokens)
	s.logprobs = make([]TokenLogprobs, maxTokens)
	return s
}

// SendLogprobs is Send with the token's log-probabilities; on a stream
// made by NewStream they are dropped. The stream keeps lp (the engine MUST
// NOT reuse lp.Top).
func (s *Stream) SendLogprobs(token int32, lp TokenLogprobs) {
	if s.sent < len(s.logprobs) {
		s.logprobs[s.sent] = lp
	}
	s.Send(token)
}

// Logprobs returns token i's log-probabilities, once token i was received
// from Tokens; false when the stream carries none.
func (s *Stream) Logprobs(i int) (TokenLogprobs, bool) {
	if i < 0 || i >= len(s.logprobs) {
		return TokenLogprobs{}, false
	}
	return s.logprobs[i], true
}

// Send passes one generated token to the client. It MUST NOT be called more
// than MaxTokens times, nor after Finish (it panics: an engine bug).
func (s *Stream) Send(token int32) {
	select {
	case s.tokens <- token:
		s.sent++
	default:
		invariants.Failf("httpapi: Stream.Send beyond the request's MaxTokens")
	}
}

// Finish ends the stream with the request's usage, or with the error that
// ended it (usage is then ignored). The engine MUST call it exactly once.
func (s *Stream) Finish(u Usage, err error) {
	s.usage, s.err = u, err
	close(s.tokens)
}

// Tokens returns the tokens as they come; the channel is closed by Finish.
func (s *Stream) Tokens() <-chan int32 { return s.tokens }

// Result returns what Finish was given. It MUST be called only after
// Tokens was closed.
func (s *Stream) Result() (Usage, error) { return s.usage, s.err }
