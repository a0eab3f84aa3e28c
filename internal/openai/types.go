package openai

// CompletionsPath is where the completions endpoint is served.
const CompletionsPath = "/v1/completions"

// CompletionRequest is the body of POST /v1/completions. Pointers mark the
// fields whose absence differs from their zero value.
type CompletionRequest struct {
	Model  string `json:"model,omitempty"`
	Prompt Prompt `json:"prompt"`
	// MaxTokens bounds the tokens generated; absent means the server's
	// default (OpenAI's is 16).
	MaxTokens     *int           `json:"max_tokens,omitempty"`
	Stream        bool           `json:"stream,omitempty"`
	StreamOptions *StreamOptions `json:"stream_options,omitempty"`
	// Temperature, when given, MUST be 0: decoding is greedy.
	Temperature *float64 `json:"temperature,omitempty"`
	// N, when given, MUST be 1.
	N *int `json:"n,omitempty"`
	// User and Salt select the tenant (see SaltOf).
	User string `json:"user,omitempty"`
	Salt string `json:"salt,omitempty"`
	// NoCache asks the server to neither read nor write its KV cache.
	NoCache bool `json:"no_cache,omitempty"`
	// ReturnTokenIDs asks for the generated token ids in each choice.
	ReturnTokenIDs bool `json:"return_token_ids,omitempty"`
	// Logprobs, when given (0 to MaxLogprobs), asks for each generated
	// token's log-probability and the Logprobs most likely tokens at its
	// position (OpenAI's completions parameter).
	Logprobs *int `json:"logprobs,omitempty"`
}

// MaxLogprobs is the most top tokens a request may ask for per position.
const MaxLogprobs = 20

// StreamOptions are the options of a streamed response.
type StreamOptions struct {
	// IncludeUsage asks for a last chunk, before [DONE], with no choices
	// and the request's usage.
	IncludeUsage bool `json:"include_usage"`
}

// CompletionResponse is the body of a response that is not streamed, and of
// each streamed chunk (Object "text_completion" in both, as OpenAI does).
type CompletionResponse struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []Choice `json:"choices"`
	// Usage is set on a whole response and on the last chunk of a stream
	// asked for with include_usage; nil on the other chunks.
	Usage *Usage `json:"usage,omitempty"`
}

// Choice is one generated sequence (always index 0 here).
type Choice struct {
	Index int    `json:"index"`
	Text  string `json:"text"`
	// TokenIDs are the generated tokens of this choice (of this chunk, when
	// streamed).
	TokenIDs []int32 `json:"token_ids,omitempty"`
	// Logprobs are the generated tokens' log-probabilities, when the
	// request asked for them.
	Logprobs *Logprobs `json:"logprobs,omitempty"`
	// FinishReason is "length" (max_tokens reached) or "stop" (the model
	// ended the sequence); null on the chunks before the last.
	FinishReason *string `json:"finish_reason"`
}

// Logprobs are a choice's log-probabilities (natural logarithms), one entry
// per generated token, in OpenAI's completions form, with kvtier's
// extension keyed by token id: the text keys of TopLogprobs collide for the
// ids the byte-level tokenizer cannot spell (they all read U+FFFD), so a
// client that compares tokens reads TopTokenIDs and TopTokenLogprobs.
type Logprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
	// TopTokenIDs[i] are the most likely tokens at position i, most likely
	// first, and TopTokenLogprobs[i] their log-probabilities.
	TopTokenIDs      [][]int32   `json:"top_token_ids,omitempty"`
	TopTokenLogprobs [][]float64 `json:"top_token_logprobs,omitempty"`
}

// Usage counts a request's tokens.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
	ServerTiming        *ServerTiming        `json:"server_timing,omitempty"`
}

// PromptTokensDetails splits the prompt's tokens by where their KV came
// from. Every prompt token was either cached (its KV loaded from a tier) or
// prefilled (computed): PromptTokens = CachedTokens + prefilled.
type PromptTokensDetails struct {
	// CachedTokens are the prompt tokens whose KV was reused, not computed
	// (OpenAI's field).
	CachedTokens int `json:"cached_tokens"`
	// CachedTokensByTier splits CachedTokens by the tier the KV was loaded
	// from; their sum is CachedTokens. A kvtier extension.
	CachedTokensByTier *TierTokens `json:"cached_tokens_by_tier,omitempty"`
	// RecomputedTokens are prompt tokens whose KV some tier held but that
	// the server chose to compute again (cheaper than loading, or the load
	// failed). They are prefilled tokens, not cached ones. A kvtier
	// extension.
	RecomputedTokens int `json:"recomputed_tokens,omitempty"`
}

// ServerTiming is where a request's time to first token went inside the
// server, in seconds: queued (parsed, waiting for the GPU) before its
// prefill started, in the prefill (from its lookup to its first token),
// in forward passes within the prefill, and waiting within the prefill for
// copies out of the GPU to free the slots of the blocks it computes. A
// kvtier extension (examples/server); other servers send none.
type ServerTiming struct {
	QueueSeconds     float64 `json:"queue_s"`
	PrefillSeconds   float64 `json:"prefill_s"`
	ForwardSeconds   float64 `json:"forward_s"`
	SpaceWaitSeconds float64 `json:"space_wait_s,omitempty"`
}

// HandlingSeconds is what a client's TTFT of ttftSeconds has beyond the
// server's queue, forward passes and waits for GPU slots: HTTP, parsing,
// the cache's bookkeeping (kvtier replay's handling).
func (t *ServerTiming) HandlingSeconds(ttftSeconds float64) float64 {
	return ttftSeconds - t.QueueSeconds - t.ForwardSeconds - t.SpaceWaitSeconds
}

// TierTokens is a token count per kvtier tier, fastest first.
type TierTokens struct {
	GPU  int `json:"gpu"`
	Host int `json:"host"`
	NVMe int `json:"nvme"`
}

// Sum returns the tokens of all tiers.
func (t TierTokens) Sum() int { return t.GPU + t.Host + t.NVMe }

// ErrorResponse is the body of every error status.
type ErrorResponse struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody describes an error. Param names the request field that was
// wrong, when one was.
type ErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// The error types used in ErrorBody.Type.
const (
	ErrInvalidRequest = "invalid_request_error"
	ErrRateLimit      = "rate_limit_error"
	ErrServer         = "server_error"
	ErrUnavailable    = "service_unavailable"
)

// FieldError is a request field that is wrong: the server answers 400 with
// Field as the error's param.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }
