package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"
)

// Client sends completion requests to one endpoint and times them. It is
// safe for concurrent use.
type Client struct {
	// URL is the completions endpoint, for example
	// http://127.0.0.1:8080/v1/completions.
	URL string
	// HTTP sends the requests; nil means http.DefaultClient.
	HTTP *http.Client
}

// Result is one completion's output and timing.
type Result struct {
	// Tokens are the generated token ids, when the server sent them
	// (token_ids); empty otherwise, and Text is then the output.
	Tokens []int32
	Text   string
	// TokenCount is the number of tokens received: len(Tokens) when the
	// server sent ids, otherwise one per chunk that carried text.
	TokenCount   int
	FinishReason string
	// Usage is the server's usage report; nil if it sent none.
	Usage *Usage
	// TTFT is the time from sending the request to receiving the first
	// token.
	TTFT time.Duration
	// InterToken holds, for each token after the first, the time since the
	// token before it; a chunk of k tokens counts as k tokens each 1/k of
	// the chunk's gap.
	InterToken []time.Duration
	// Latency is the time from sending the request to the end of the
	// response.
	Latency time.Duration
	// Logprobs has one entry per generated token when the request asked
	// for logprobs and the server sent them by id (kvtier's top_token_ids);
	// empty otherwise.
	Logprobs []TokenLogprob
}

// TokenLogprob is one generated token's log-probability and the most
// likely tokens at its position, most likely first.
type TokenLogprob struct {
	Logprob float64
	Top     []TopLogprob
}

// TopLogprob is one of the most likely tokens at a position.
type TopLogprob struct {
	ID      int32
	Logprob float64
}

// StatusError is a response the server refused or failed: an error status
// (Status), or an error event inside a stream that had begun (Status 200,
// InStream).
type StatusError struct {
	Status   int
	InStream bool
	Type     string
	Param    string
	Message  string
}

func (e *StatusError) Error() string {
	where := fmt.Sprintf("status %d", e.Status)
	if e.InStream {
		where = "error event in the stream"
	}
	if e.Param != "" {
		return fmt.Sprintf("openai: %s: %s (param %s)", where, e.Message, e.Param)
	}
	return fmt.Sprintf("openai: %s: %s", where, e.Message)
}

// Complete sends req as a streamed request (it sets Stream and
// include_usage, so that tokens can be timed) and reads the response to its
// end. A server that answers with a whole JSON response instead is read as
// one chunk. Errors: *StatusError for an error status or error event,
// otherwise the transport's or the decoder's error (wrapped).
func (c *Client) Complete(ctx context.Context, req CompletionRequest) (*Result, error) {
	req.Stream = true
	req.StreamOptions = &StreamOptions{IncludeUsage: true}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("openai: %w", err)
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("openai: %w", err)
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "text/event-stream")
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	start := time.Now()
	resp, err := hc.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("openai: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(resp)
	}
	res := &Result{}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt == "application/json" {
		var whole CompletionResponse
		if err := json.NewDecoder(resp.Body).Decode(&whole); err != nil {
			return nil, fmt.Errorf("openai: response: %w", err)
		}
		res.TTFT = time.Since(start)
		var text strings.Builder
		res.add(&whole, &text)
		res.Text = text.String()
		res.Latency = res.TTFT
		return res, nil
	}
	if err := res.readStream(resp.Body, start); err != nil {
		return nil, err
	}
	return res, nil
}

// readStream reads a stream's chunks to [DONE], timing its tokens.
func (r *Result) readStream(body io.Reader, start time.Time) error {
	ev := NewEventReader(body)
	last := start
	var text strings.Builder
	defer func() { r.Text = text.String() }()
	for {
		data, err := ev.Next()
		if err == io.EOF {
			return fmt.Errorf("openai: stream ended without %s", DoneData)
		}
		if err != nil {
			return fmt.Errorf("openai: stream: %w", err)
		}
		if string(data) == DoneData {
			r.Latency = time.Since(start)
			return nil
		}
		if bytes.HasPrefix(data, []byte(`{"error"`)) {
			var e ErrorResponse
			if json.Unmarshal(data, &e) == nil {
				return toStatusError(http.StatusOK, true, &e)
			}
		}
		var chunk CompletionResponse
		if err := json.Unmarshal(data, &chunk); err != nil {
			return fmt.Errorf("openai: stream chunk: %w", err)
		}
		now := time.Now()
		if n := r.add(&chunk, &text); n > 0 {
			if r.TokenCount == n {
				r.TTFT = now.Sub(start)
			} else {
				gap := now.Sub(last) / time.Duration(n)
				for range n {
					r.InterToken = append(r.InterToken, gap)
				}
			}
			last = now
		}
	}
}

// add folds a chunk (or a whole response) into r, its text into text, and
// returns the number of tokens it carried.
func (r *Result) add(c *CompletionResponse, text *strings.Builder) int {
	if c.Usage != nil {
		r.Usage = c.Usage
	}
	n := 0
	for i := range c.Choices {
		ch := &c.Choices[i]
		text.WriteString(ch.Text)
		r.Tokens = append(r.Tokens, ch.TokenIDs...)
		switch {
		case len(ch.TokenIDs) > 0:
			n += len(ch.TokenIDs)
		case ch.Text != "":
			n++
		}
		if lp := ch.Logprobs; lp != nil && len(lp.TopTokenIDs) == len(lp.TokenLogprobs) && len(lp.TopTokenLogprobs) == len(lp.TokenLogprobs) {
			for i, v := range lp.TokenLogprobs {
				t := TokenLogprob{Logprob: v}
				for j, id := range lp.TopTokenIDs[i] {
					if j < len(lp.TopTokenLogprobs[i]) {
						t.Top = append(t.Top, TopLogprob{ID: id, Logprob: lp.TopTokenLogprobs[i][j]})
					}
				}
				r.Logprobs = append(r.Logprobs, t)
			}
		}
		if ch.FinishReason != nil {
			r.FinishReason = *ch.FinishReason
		}
	}
	r.TokenCount += n
	return n
}

// statusError reads an error response's body.
func statusError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e ErrorResponse
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" {
		return &StatusError{Status: resp.StatusCode, Message: string(bytes.TrimSpace(b))}
	}
	return toStatusError(resp.StatusCode, false, &e)
}

func toStatusError(status int, inStream bool, e *ErrorResponse) *StatusError {
	se := &StatusError{Status: status, InStream: inStream, Type: e.Error.Type, Message: e.Error.Message}
	if e.Error.Param != nil {
		se.Param = *e.Error.Param
	}
	return se
}

// IsStatus reports whether err is a *StatusError with the given status.
func IsStatus(err error, status int) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Status == status && !se.InStream
}
