package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier"
)

// errBodyTooLarge marks a body over Config.MaxBodyBytes (413).
var errBodyTooLarge = errors.New("body too large")

// decodeRequest reads a completion request and checks it against lim. It
// returns the request and the prompt's tokens, or a *openai.FieldError (400)
// or an error wrapping errBodyTooLarge (413).
func decodeRequest(body io.Reader, lim Limits, defaultMaxTokens int) (*openai.CompletionRequest, []int32, error) {
	var req openai.CompletionRequest
	dec := json.NewDecoder(body)
	if err := dec.Decode(&req); err != nil {
		return nil, nil, bodyError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, nil, bodyError(err)
		}
		return nil, nil, &openai.FieldError{Field: "body", Msg: "more after the request's JSON object"}
	}
	toks, err := checkRequest(&req, lim, defaultMaxTokens)
	return &req, toks, err
}

// bodyError turns a decoding error into a *openai.FieldError naming the
// field where json names one.
func bodyError(err error) error {
	var fe *openai.FieldError
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return fmt.Errorf("%w: over %d bytes", errBodyTooLarge, mbe.Limit)
	case errors.As(err, &fe):
		return fe
	case errors.As(err, &te) && te.Field != "":
		return &openai.FieldError{Field: te.Field, Msg: fmt.Sprintf("want %s, got JSON %s", te.Type, te.Value)}
	case errors.As(err, &te):
		return &openai.FieldError{Field: "body", Msg: fmt.Sprintf("want a JSON object, got JSON %s", te.Value)}
	case errors.As(err, &se):
		return &openai.FieldError{Field: "body", Msg: fmt.Sprintf("invalid JSON at byte %d: %v", se.Offset, se)}
	case errors.Is(err, io.EOF):
		return &openai.FieldError{Field: "body", Msg: "empty: want a JSON object"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &openai.FieldError{Field: "body", Msg: "invalid JSON: it ends before the request object does"}
	}
	return &openai.FieldError{Field: "body", Msg: err.Error()}
}

// checkRequest checks a decoded request's fields, sets its MaxTokens, and
// returns its prompt's tokens.
func checkRequest(req *openai.CompletionRequest, lim Limits, defaultMaxTokens int) ([]int32, error) {
	bad := func(field, format string, args ...any) error {
		return &openai.FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if req.Temperature != nil && *req.Temperature != 0 {
		return nil, bad("temperature", "%g: decoding is greedy, temperature must be 0 or absent", *req.Temperature)
	}
	if req.N != nil && *req.N != 1 {
		return nil, bad("n", "%d: only one choice per request (n = 1)", *req.N)
	}
	if req.Model != "" && lim.Model != "" && req.Model != lim.Model {
		return nil, bad("model", "%q: this server serves %q", req.Model, lim.Model)
	}
	if req.Logprobs != nil && (*req.Logprobs < 0 || *req.Logprobs > openai.MaxLogprobs) {
		return nil, bad("logprobs", "%d: want 0 to %d", *req.Logprobs, openai.MaxLogprobs)
	}
	maxTokens := defaultMaxTokens
	if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	if maxTokens < 1 {
		return nil, bad("max_tokens", "%d: must be at least 1", maxTokens)
	}
	req.MaxTokens = &maxTokens
	var toks []int32
	if req.Prompt.IsTokens {
		toks = req.Prompt.Tokens
		for i, t := range toks {
			if int(t) >= lim.VocabSize {
				return nil, bad("prompt", "token %d is id %d, outside the model's vocabulary of %d", i, t, lim.VocabSize)
			}
		}
	} else {
		if lim.VocabSize < openai.ByteVocab {
			return nil, bad("prompt", "text prompts are byte-level tokens and need a vocabulary of %d ids; this model has %d: send token ids", openai.ByteVocab, lim.VocabSize)
		}
		toks = openai.AppendBytesAsTokens(make([]int32, 0, len(req.Prompt.Text)), req.Prompt.Text)
	}
	if len(toks) == 0 {
		return nil, bad("prompt", "missing or empty")
	}
	if len(toks) > lim.ContextTokens {
		return nil, bad("prompt", "%d tokens, longer than the model's context of %d", len(toks), lim.ContextTokens)
	}
	if len(toks)+maxTokens > lim.ContextTokens {
		return nil, bad("max_tokens", "%d: the prompt's %d tokens plus max_tokens exceed the model's context of %d", maxTokens, len(toks), lim.ContextTokens)
	}
	return toks, nil
}

// requestSalt returns the kvtier salt of a request's tenant.
func requestSalt(req *openai.CompletionRequest) kvtier.Salt {
	return kvtier.Salt(openai.SaltOf(req.User, req.Salt))
}
