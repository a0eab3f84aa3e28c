package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier"
)

// completions answers POST /v1/completions. A request is in flight (Drain
// waits for it) from the end of its decoding to its answer.
func (a *API) completions(w http.ResponseWriter, r *http.Request) {
	arrival := time.Now()
	req, toks, err := a.readRequest(w, r)
	if err != nil {
		a.failRequest(w, err)
		return
	}
	if !a.begin() {
		a.failRequest(w, errDraining)
		return
	}
	defer a.end()
	c := &completion{
		api: a, w: w, rc: http.NewResponseController(w), r: r, wire: req, promptTokens: len(toks),
		id: "cmpl-" + strconv.FormatUint(a.nextID.Add(1), 16), created: arrival.Unix(),
		model: a.limits.Model, timer: tokenTimer{m: a.m, start: arrival},
	}
	if c.model == "" {
		c.model = req.Model
	}
	breq := &Request{ID: c.id, Tokens: toks, MaxTokens: *req.MaxTokens, Salt: requestSalt(req),
		NoCache: req.NoCache, Arrival: arrival}
	c.out = NewStream(breq.MaxTokens)
	if req.Logprobs != nil {
		breq.Logprobs, breq.TopLogprobs = true, *req.Logprobs
		c.out = NewLogprobsStream(breq.MaxTokens)
	}
	if err := a.backend.Submit(r.Context(), breq, c.out); err != nil {
		a.failRequest(w, err)
		return
	}
	defer c.rc.SetWriteDeadline(time.Time{}) // what follows on the connection has its own
	if req.Stream {
		c.stream()
	} else {
		c.whole()
	}
}

// completion is one request being answered.
type completion struct {
	api          *API
	w            http.ResponseWriter
	rc           *http.ResponseController
	r            *http.Request
	wire         *openai.CompletionRequest
	out          *Stream
	promptTokens int
	id, model    string
	created      int64
	timer        tokenTimer
}

// whole answers with one JSON response once the engine has finished.
func (c *completion) whole() {
	gen := make([]int32, 0, *c.wire.MaxTokens)
	for tok := range c.out.Tokens() {
		c.timer.token(time.Now())
		gen = append(gen, tok)
	}
	u, err := c.result(len(gen))
	if err != nil {
		c.failed(err, false)
		return
	}
	var text []byte
	for _, t := range gen {
		text = openai.AppendTokenText(text, t)
	}
	reason := c.finishReason(len(gen))
	resp := openai.CompletionResponse{ID: c.id, Object: "text_completion", Created: c.created, Model: c.model,
		Choices: []openai.Choice{{Text: string(text), TokenIDs: gen, Logprobs: c.wireLogprobs(gen, 0, 0), FinishReason: &reason}},
		Usage:   c.wireUsage(&u, len(gen))}
	body, err := json.Marshal(&resp)
	if err != nil {
		c.failed(err, false)
		return
	}
	c.w.Header().Set("Content-Type", "application/json")
	c.w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	c.w.WriteHeader(http.StatusOK)
	c.write(body)
	c.api.m.answered(http.StatusOK)
}

// write sends b to the client now, within the write timeout. An error
// means the client left or took too long: the server then cancels the
// request's context, which the engine sees.
func (c *completion) write(b []byte) {
	_ = c.rc.SetWriteDeadline(time.Now().Add(c.api.writeTimeout))
	c.w.Write(b)
	_ = c.rc.Flush()
}

// stream answers with server-sent events: one chunk per token as the
// engine sends it (the tokens already waiting are written together and
// flushed once), a last chunk with finish_reason, the usage chunk when
// asked for, and [DONE]. The status is sent with the first token, so that
// an engine failure before it is still an error status.
func (c *completion) stream() {
	prefix := c.chunkPrefix()
	buf := make([]byte, 0, 4<<10)
	var scratch []byte
	started, n, offset := false, 0, 0
	tokens := c.out.Tokens()
	for tok := range tokens {
		buf = buf[:0]
		closed := false
		for {
			c.timer.token(time.Now())
			n++
			scratch = openai.AppendTokenText(scratch[:0], tok)
			var lp []byte
			if c.wire.Logprobs != nil {
				lp, _ = json.Marshal(c.wireLogprobs([]int32{tok}, n-1, offset))
			}
			offset += len(scratch)
			buf = appendTokenEvent(buf, prefix, scratch, tok, lp)
			var ok bool
			select {
			case tok, ok = <-tokens:
				if ok {
					continue
				}
				closed = true
			default:
			}
			break
		}
		if !started {
			c.startStream()
			started = true
		}
		c.write(buf)
		if closed {
			break
		}
	}
	u, err := c.result(n)
	if err != nil {
		c.failed(err, started)
		return
	}
	if !started {
		c.startStream()
	}
	buf = append(buf[:0], "data: "...)
	buf = append(buf, prefix...)
	buf = append(buf, `"","finish_reason":"`...)
	buf = append(buf, c.finishReason(n)...)
	buf = append(buf, "\"}]}\n\n"...)
	if c.wire.StreamOptions != nil && c.wire.StreamOptions.IncludeUsage {
		last := openai.CompletionResponse{ID: c.id, Object: "text_completion", Created: c.created, Model: c.model,
			Choices: []openai.Choice{}, Usage: c.wireUsage(&u, n)}
		body, _ := json.Marshal(&last)
		buf = openai.AppendEvent(buf, body)
	}
	buf = openai.AppendEvent(buf, []byte(openai.DoneData))
	c.write(buf)
	c.api.m.answered(http.StatusOK)
}

func (c *completion) startStream() {
	h := c.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	c.w.WriteHeader(http.StatusOK)
}

// result returns the engine's result once its stream is closed, and counts
// the usage of a request that succeeded. A usage that claims more cached
// tokens than the prompt has is an engine error.
func (c *completion) result(generated int) (Usage, error) {
	u, err := c.out.Result()
	if err != nil {
		return u, err
	}
	if cached := u.CachedTokens(); cached > c.promptTokens || cached < 0 {
		return u, fmt.Errorf("httpapi: engine reported %d cached tokens for a prompt of %d", cached, c.promptTokens)
	}
	c.api.m.usage(&u, c.promptTokens, generated)
	return u, nil
}

// failed answers a request the engine failed: an error status, or an error
// event once the stream has started. If the client went away, it aborts
// the connection instead, so that a client that only half-closed it reads
// no answer (not an empty 200, nor a stream that ends as if complete).
func (c *completion) failed(err error, started bool) {
	if c.r.Context().Err() != nil {
		c.api.m.canceled.Inc()
		panic(http.ErrAbortHandler) // net/http's way to abort: the connection is closed, nothing logged
	}
	if !started {
		c.api.failRequest(c.w, err)
		return
	}
	body, _ := json.Marshal(openai.ErrorResponse{Error: openai.ErrorBody{Message: clip(err.Error()), Type: openai.ErrServer}})
	c.write(openai.AppendEvent(nil, body))
	c.api.m.answered(http.StatusInternalServerError)
}

// finishReason is "length" when the engine generated max_tokens, "stop"
// when it ended the sequence before.
func (c *completion) finishReason(generated int) string {
	if generated >= *c.wire.MaxTokens {
		return "length"
	}
	return "stop"
}

// wireUsage returns a finished request's usage as sent.
func (c *completion) wireUsage(u *Usage, generated int) *openai.Usage {
	byTier := openai.TierTokens{GPU: u.LoadedTokens[kvtier.GPU], Host: u.LoadedTokens[kvtier.Host],
		NVMe: u.LoadedTokens[kvtier.NVMe]}
	return &openai.Usage{PromptTokens: c.promptTokens, CompletionTokens: generated,
		TotalTokens: c.promptTokens + generated,
		PromptTokensDetails: &openai.PromptTokensDetails{CachedTokens: byTier.Sum(),
			CachedTokensByTier: &byTier, RecomputedTokens: u.RecomputedTokens},
		ServerTiming: &openai.ServerTiming{QueueSeconds: u.QueueSeconds, PrefillSeconds: u.PrefillSeconds,
			ForwardSeconds: u.ForwardSeconds, SpaceWaitSeconds: u.SpaceWaitSeconds}}
}

// chunkPrefix is every chunk's JSON up to its text's value.
func (c *completion) chunkPrefix() []byte {
	model, _ := json.Marshal(c.model)
	b := []byte(`{"id":"` + c.id + `","object":"text_completion","created":`)
	b = strconv.AppendInt(b, c.created, 10)
	b = append(b, `,"model":`...)
	b = append(b, model...)
	return append(b, `,"choices":[{"index":0,"text":`...)
}

// appendTokenEvent appends the event of one token's chunk; logprobs, if
// not nil, is the chunk's logprobs object as JSON.
func appendTokenEvent(dst, prefix, text []byte, tok int32, logprobs []byte) []byte {
	dst = append(dst, "data: "...)
	dst = append(dst, prefix...)
	dst = appendJSONString(dst, text)
	dst = append(dst, `,"token_ids":[`...)
	dst = strconv.AppendInt(dst, int64(tok), 10)
	dst = append(dst, ']')
	if logprobs != nil {
		dst = append(dst, `,"logprobs":`...)
		dst = append(dst, logprobs...)
	}
	return append(dst, ",\"finish_reason\":null}]}\n\n"...)
}

// wireLogprobs returns the logprobs object of gen, the generated tokens
// from the first'th, whose text starts at offset bytes into the
// completion's; nil when the request did not ask for logprobs.
func (c *completion) wireLogprobs(gen []int32, first, offset int) *openai.Logprobs {
	if c.wire.Logprobs == nil {
		return nil
	}
	lp := &openai.Logprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{},
		TopTokenIDs: [][]int32{}, TopTokenLogprobs: [][]float64{}}
	var text []byte
	for i, tok := range gen {
		t, _ := c.out.Logprobs(first + i)
		text = openai.AppendTokenText(text[:0], tok)
		lp.Tokens = append(lp.Tokens, string(text))
		lp.TokenLogprobs = append(lp.TokenLogprobs, float64(t.Logprob))
		lp.TextOffset = append(lp.TextOffset, offset)
		offset += len(text)
		top := make(map[string]float64, len(t.Top))
		ids, lps := make([]int32, 0, len(t.Top)), make([]float64, 0, len(t.Top))
		for _, tt := range t.Top {
			k := string(openai.AppendTokenText(nil, tt.ID))
			if _, dup := top[k]; !dup { // the most likely of the ids that read the same
				top[k] = float64(tt.Logprob)
			}
			ids, lps = append(ids, tt.ID), append(lps, float64(tt.Logprob))
		}
		lp.TopLogprobs = append(lp.TopLogprobs, top)
		lp.TopTokenIDs, lp.TopTokenLogprobs = append(lp.TopTokenIDs, ids), append(lp.TopTokenLogprobs, lps)
	}
	return lp
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD (as
// encoding/json does).
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			switch {
			case b == '"' || b == '\\':
				dst = append(dst, '\\', b)
			case b < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
			default:
				dst = append(dst, b)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}

// failRequest answers err: 400 naming the field for a *openai.FieldError,
// 408 for a body not in time, 413 for a body too large, 429 for
// ErrQueueFull, 503 while draining, 500 otherwise. A client that left
// before its body was read gets nothing: its connection is aborted. After
// a 408, 413 or 503 the connection closes (what is left of the body is
// not read).
func (a *API) failRequest(w http.ResponseWriter, err error) {
	var fe *openai.FieldError
	switch {
	case errors.As(err, &fe):
		a.fail(w, http.StatusBadRequest, openai.ErrInvalidRequest, fe.Field, fe.Error())
	case errors.Is(err, errClientGone):
		a.m.canceled.Inc()
		panic(http.ErrAbortHandler)
	case errors.Is(err, errBodyTimeout):
		w.Header().Set("Connection", "close")
		a.fail(w, http.StatusRequestTimeout, openai.ErrInvalidRequest, "body", fmt.Sprintf("body: not received in full within %v", a.bodyTimeout))
	case errors.Is(err, errBodyTooLarge):
		w.Header().Set("Connection", "close")
		a.fail(w, http.StatusRequestEntityTooLarge, openai.ErrInvalidRequest, "body", err.Error())
	case errors.Is(err, errDraining):
		w.Header().Set("Connection", "close")
		a.fail(w, http.StatusServiceUnavailable, openai.ErrUnavailable, "", err.Error())
	case errors.Is(err, ErrQueueFull):
		w.Header().Set("Retry-After", "1")
		a.fail(w, http.StatusTooManyRequests, openai.ErrRateLimit, "", err.Error())
	default:
		a.fail(w, http.StatusInternalServerError, openai.ErrServer, "", clip(err.Error()))
	}
}

// fail writes an error response and counts it.
func (a *API) fail(w http.ResponseWriter, status int, typ, param, msg string) {
	writeError(w, status, typ, param, msg)
	a.m.answered(status)
}

// writeError writes an OpenAI error response; param, if not empty, names
// the field at fault.
func writeError(w http.ResponseWriter, status int, typ, param, msg string) {
	e := openai.ErrorResponse{Error: openai.ErrorBody{Message: msg, Type: typ}}
	if param != "" {
		e.Error.Param = &param
	}
	body, _ := json.Marshal(&e)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}
