package benchserve

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"time"

	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier/trace"
)

// Config is one benchmark run. Its fields are named as bench-serve's flags
// are, and so are Validate's errors.
type Config struct {
	// URL is the server: a base URL such as http://127.0.0.1:8080, to which
	// openai.CompletionsPath is appended, or the endpoint's full URL.
	URL string
	// Trace names the trace in the report; Open returns its lines from the
	// start (see BundledTrace and FileTrace).
	Trace string
	Open  func() (io.ReadCloser, error)
	// Format and SkipBad are passed to trace.Reader.
	Format  trace.Format
	SkipBad bool
	// Model is each request's model field; empty leaves it out.
	Model string
	// Speed divides the trace's arrival times: 2 replays twice as fast. It
	// MUST be above 0 unless Concurrency is set.
	Speed float64
	// Concurrency, when above 0, replaces the trace's arrivals by that many
	// clients sending back to back.
	Concurrency int
	// Requests bounds the requests sent; 0 sends the whole trace.
	Requests int
	// Duration bounds the run; requests in flight at its end are cancelled
	// and counted as such. 0 means no limit.
	Duration time.Duration
	// Timeout bounds one request (a request that runs out is an error).
	// Required.
	Timeout time.Duration
	// Verify, when above 0, sends every Verify-th request again with no
	// cache and compares the answers.
	Verify int
	// VerifyLogprobs is how many most likely tokens per position a
	// verified request and its reference ask for (the logprobs field), so
	// that a differing token can be told a near tie; 0 asks for none (every
	// differing token is then a difference).
	VerifyLogprobs int
	// VerifyTolerance, in nats: a first differing token is a near tie, not
	// a difference, when in each answer the other's token is among its top
	// tokens no more than VerifyTolerance below its own choice. For example
	// 0.05: the bf16 rounding of KV computed in other shapes (see
	// VerifyReport).
	VerifyTolerance float64
	// PerRequest adds one record per request to the report
	// (Report.Requests), to compare request by request with a replay.
	PerRequest bool
	// Vocab: prompt token ids are drawn from [0, Vocab). For example 256
	// for a byte-level model, 128256 for Llama 3.
	Vocab int
	// Seed changes the token ids every block becomes.
	Seed uint64
	// BlockTokens, when above 0, is the length a full trace block becomes in
	// the prompts sent (a partial last block shrinks in proportion): 16
	// turns Mooncake's 512-token blocks into 16-token ones, for a model with
	// a short context, keeping the shared prefixes.
	BlockTokens int
	// MaxPromptTokens, when above 0, cuts prompts to that many tokens.
	MaxPromptTokens int
	// MaxTokens, when above 0, caps each request's max_tokens (the trace's
	// output length otherwise).
	MaxTokens int
	// OnDone, when set, is called as each request ends (a progress bar).
	OnDone func()
	// HTTP sends the requests; nil makes a client that keeps many
	// connections open to the one server.
	HTTP *http.Client
}

// BundledTrace sets cfg's trace to the one bundled with kvtier/trace.
func (c *Config) BundledTrace() {
	c.Trace = trace.BundledName
	c.Open = func() (io.ReadCloser, error) { return io.NopCloser(trace.Bundled()), nil }
	if c.Format == trace.FormatAuto {
		c.Format = trace.FormatMooncake
	}
}

// FileTrace sets cfg's trace to a file, gzip-compressed or not.
func (c *Config) FileTrace(path string) {
	c.Trace = path
	c.Open = func() (io.ReadCloser, error) { return trace.Open(path) }
}

// ConfigError is a Config field (named as its flag) with a bad value.
type ConfigError struct {
	Field string
	Value any
	Msg   string
}

func (e *ConfigError) Error() string { return fmt.Sprintf("--%s %v: %s", e.Field, e.Value, e.Msg) }

// Validate checks c, returning a *ConfigError for the first bad field.
func (c *Config) Validate() error {
	if _, err := CompletionsURL(c.URL); err != nil {
		return err
	}
	checks := []struct {
		bad   bool
		field string
		value any
		msg   string
	}{
		{c.Open == nil, "trace", c.Trace, "no trace to open"},
		{c.Concurrency == 0 && (!(c.Speed > 0) || math.IsInf(c.Speed, 0)), "speed", c.Speed, "want a number above 0"},
		{c.Concurrency < 0, "concurrency", c.Concurrency, "want 0 (the trace's arrivals) or more"},
		{c.Requests < 0, "requests", c.Requests, "want 0 (the whole trace) or more"},
		{c.Duration < 0, "duration", c.Duration, "want 0 (no limit) or more"},
		{c.Timeout <= 0, "timeout", c.Timeout, "want more than 0"},
		{c.Verify < 0, "verify", c.Verify, "want 0 (off) or more"},
		{c.VerifyLogprobs < 0 || c.VerifyLogprobs > openai.MaxLogprobs, "verify-logprobs", c.VerifyLogprobs, fmt.Sprintf("want 0 to %d", openai.MaxLogprobs)},
		{!(c.VerifyTolerance >= 0) || math.IsInf(c.VerifyTolerance, 0), "verify-tolerance", c.VerifyTolerance, "want 0 (exact tokens) or more, in nats"},
		{c.Vocab < 1 || c.Vocab > math.MaxInt32, "vocab", c.Vocab, "want 1 to 2147483647"},
		{c.BlockTokens < 0 || c.BlockTokens > trace.MaxBlockTokens, "block-tokens", c.BlockTokens,
			fmt.Sprintf("want 0 (the trace's) to %d", trace.MaxBlockTokens)},
		{c.MaxPromptTokens < 0, "max-prompt-tokens", c.MaxPromptTokens, "want 0 (no limit) or more"},
		{c.MaxTokens < 0, "max-tokens", c.MaxTokens, "want 0 (the trace's) or more"},
	}
	for _, k := range checks {
		if k.bad {
			return &ConfigError{Field: k.field, Value: k.value, Msg: k.msg}
		}
	}
	return nil
}

// CompletionsURL returns the completions endpoint of a --url: the URL
// itself, or with openai.CompletionsPath appended when it has no path.
func CompletionsURL(raw string) (string, error) {
	if raw == "" {
		return "", errors.New("--url is required (for example --url http://127.0.0.1:8080)")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", &ConfigError{Field: "url", Value: fmt.Sprintf("%q", raw), Msg: err.Error()}
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", &ConfigError{Field: "url", Value: fmt.Sprintf("%q", raw), Msg: "want an http:// or https:// URL"}
	}
	if u.Host == "" {
		return "", &ConfigError{Field: "url", Value: fmt.Sprintf("%q", raw), Msg: "no host"}
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = openai.CompletionsPath
	}
	return u.String(), nil
}
