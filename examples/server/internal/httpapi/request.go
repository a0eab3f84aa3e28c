package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier"
)

// errBodyTooLarge marks a body over Config.MaxBodyBytes (413).
var errBodyTooLarge = errors.New("body too large")

// Derived body caps (Config.MaxBodyBytes 0): a request's fields besides
// its prompt, and each prompt token, at most. A token is an id of up to 6
// digits with its comma and some whitespace, or a byte of text escaped as
// \u00XX; 16 bytes leave room for pretty-printed arrays.
const (
	bodyOverheadBytes = 16 << 10
	bodyBytesPerToken = 16
)

// bodyCap is the body cap of a model of lim: 32 KiB at a 1,024-token
// context, 2 MiB at 131,072.
func bodyCap(lim Limits) int64 {
	return bodyOverheadBytes + bodyBytesPerToken*int64(lim.ContextTokens)
}

// wireRequest is a completion request as the API decodes it: the prompt
// goes to boundedPrompt (the outer field hides the embedded one).
type wireRequest struct {
	openai.CompletionRequest
	Prompt boundedPrompt `json:"prompt"`
}

// boundedPrompt reads a prompt that may hold at most maxTokens tokens,
// reading no id past the first one too many.
type boundedPrompt struct {
	prompt    openai.Prompt
	maxTokens int
}

func (p *boundedPrompt) UnmarshalJSON(b []byte) error {
	q, err := openai.DecodePrompt(b, p.maxTokens)
	switch {
	case errors.Is(err, openai.ErrPromptTooLong):
		return &openai.FieldError{Field: "prompt", Msg: fmt.Sprintf("more than %d tokens, longer than the model's context of %d", p.maxTokens, p.maxTokens)}
	case err != nil:
		return &openai.FieldError{Field: "prompt", Msg: err.Error()}
	}
	p.prompt = q
	return nil
}

// readBody reads a body whose Content-Length is size (-1: unknown) into
// one buffer of that size, or one grown as it comes. The caller bounds r
// (http.MaxBytesReader). Its errors wrap errBodyTooLarge (413) or
// errBodyTimeout (408), or are a *openai.FieldError (400).
func readBody(r io.Reader, size int64) ([]byte, error) {
	buf := make([]byte, 0, 512)
	if size >= 0 {
		buf = make([]byte, 0, size+1) // +1: the read that finds EOF needs room
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		var mbe *http.MaxBytesError
		switch {
		case err == io.EOF:
			return buf, nil
		case errors.As(err, &mbe):
			return nil, fmt.Errorf("%w: over %d bytes", errBodyTooLarge, mbe.Limit)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, fmt.Errorf("%w: %w", errBodyTimeout, err)
		case err != nil:
			return nil, &openai.FieldError{Field: "body", Msg: fmt.Sprintf("reading it after %d bytes: %v", len(buf), err)}
		}
	}
}

// decodeRequest decodes a completion request and checks it against lim. It
// returns the request and the prompt's tokens, or a *openai.FieldError
// (400). The prompt's ids are read in one pass that stops at the first
// one past lim.ContextTokens.
func decodeRequest(body []byte, lim Limits, defaultMaxTokens int) (*openai.CompletionRequest, []int32, error) {
	wire := wireRequest{Prompt: boundedPrompt{maxTokens: lim.ContextTokens}}
	if err := json.Unmarshal(body, &wire); err != nil {
		return nil, nil, bodyError(err, body)
	}
	req := &wire.CompletionRequest
	req.Prompt = wire.Prompt.prompt
	toks, err := checkRequest(req, lim, defaultMaxTokens)
	return req, toks, err
}

// bodyError turns a decoding error of body into a *openai.FieldError
// naming the field where json names one.
func bodyError(err error, body []byte) error {
	var fe *openai.FieldError
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &fe):
		return fe
	case errors.As(err, &te) && te.Field != "":
		field := strings.TrimPrefix(te.Field, "CompletionRequest.") // wireRequest's embedded struct
		return &openai.FieldError{Field: field, Msg: fmt.Sprintf("want %s, got JSON %s", te.Type, clip(te.Value))}
	case errors.As(err, &te):
		return &openai.FieldError{Field: "body", Msg: fmt.Sprintf("want a JSON object, got JSON %s", clip(te.Value))}
	case len(bytes.TrimLeft(body, " \t\r\n")) == 0:
		return &openai.FieldError{Field: "body", Msg: "empty: want a JSON object"}
	case errors.As(err, &se) && se.Offset > 0 && se.Offset <= int64(len(body)) && json.Valid(body[:se.Offset-1]):
		// What comes before the character json stopped at is JSON whole.
		return &openai.FieldError{Field: "body", Msg: "more after the request's JSON object"}
	case errors.As(err, &se) && se.Offset == int64(len(body)):
		return &openai.FieldError{Field: "body", Msg: "invalid JSON: it ends before the request object does"}
	case errors.As(err, &se):
		return &openai.FieldError{Field: "body", Msg: fmt.Sprintf("invalid JSON at byte %d: %v", se.Offset, se)}
	}
	return &openai.FieldError{Field: "body", Msg: clip(err.Error())}
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
		return nil, bad("model", "%s: this server serves %q", clip(strconv.Quote(req.Model)), lim.Model)
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
	if maxTokens > lim.ContextTokens-len(toks) { // not len+max > context: max may be near MaxInt
		return nil, bad("max_tokens", "%d: the prompt's %d tokens plus max_tokens exceed the model's context of %d", maxTokens, len(toks), lim.ContextTokens)
	}
	return toks, nil
}

// clipBytes is the most of a client's value an error echoes.
const clipBytes = 64

// clip cuts s, a value from the request, to clipBytes for an error's
// message, saying how long it was.
func clip(s string) string {
	if len(s) <= clipBytes {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", strings.ToValidUTF8(s[:clipBytes], ""), len(s))
}

// requestSalt returns the kvtier salt of a request's tenant.
func requestSalt(req *openai.CompletionRequest) kvtier.Salt {
	return kvtier.Salt(openai.SaltOf(req.User, req.Salt))
}
