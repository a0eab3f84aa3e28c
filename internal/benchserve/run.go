package benchserve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier/trace"
)

// job is one request to send.
type job struct {
	index   int // in dispatch order, from 0
	arrival time.Duration
	req     openai.CompletionRequest
}

// outcome is one request's result.
type outcome struct {
	res       *openai.Result
	err       error
	cancelled bool // the run ended (--duration, a signal) before the answer
	// verified and verifyErr are the no-cache reference's comparison;
	// drift is the comparison's largest logprob difference of a shared
	// token.
	verified  bool
	mismatch  *Mismatch
	drift     float64
	refTokens int // the reference's generated tokens
	verifyErr error
	sent      time.Duration // from the run's start
}

// Run replays cfg's trace against the server and returns the report. A
// request that fails is counted in the report, not returned; Run's errors
// are a bad Config (*ConfigError), a trace that cannot be opened, and a
// malformed trace line (*trace.LineError). Cancelling ctx ends the run as
// Duration does.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := cfg
	a.URL, _ = CompletionsURL(cfg.URL)
	// Read the trace once before sending anything, so that a malformed line
	// stops the run before the server has seen a request.
	if err := checkTrace(&a); err != nil {
		return nil, err
	}
	rc, err := a.Open()
	if err != nil {
		return nil, fmt.Errorf("benchserve: %w", err)
	}
	defer rc.Close()
	rd := trace.NewReader(rc, trace.Options{Format: a.Format, Name: a.Trace, SkipBad: a.SkipBad})
	if a.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.Duration)
		defer cancel()
	}
	client := &openai.Client{URL: a.URL, HTTP: a.HTTP}
	if client.HTTP == nil {
		tr := &http.Transport{MaxIdleConnsPerHost: 4096, DisableCompression: true}
		defer tr.CloseIdleConnections()
		client.HTTP = &http.Client{Transport: tr}
	}
	pm := promptMaker{vocab: uint32(a.Vocab), seed: a.Seed, blockTokens: a.BlockTokens, maxTokens: a.MaxPromptTokens}
	col := newCollector(&a)
	start := time.Now()
	send := func(j job) {
		sent := time.Since(start)
		o := sendOne(ctx, client, &a, j)
		o.sent = sent
		col.add(&j, o)
		if a.OnDone != nil {
			a.OnDone()
		}
	}
	var wg sync.WaitGroup
	var readErr error
	if a.Concurrency > 0 {
		jobs := make(chan job)
		for range a.Concurrency {
			wg.Go(func() {
				for j := range jobs {
					send(j)
				}
			})
		}
		readErr = dispatch(ctx, rd, &a, &pm, col, func(j job) bool {
			select {
			case jobs <- j:
				return true
			case <-ctx.Done():
				return false
			}
		})
		close(jobs)
	} else {
		readErr = dispatch(ctx, rd, &a, &pm, col, func(j job) bool {
			at := time.Duration(float64(j.arrival) / a.Speed)
			if wait := time.Until(start.Add(at)); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return false
				}
			}
			wg.Go(func() { send(j) })
			return true
		})
	}
	wg.Wait()
	wall := time.Since(start)
	if readErr != nil {
		return nil, readErr
	}
	return col.report(&a, rd, wall), nil
}

// checkTrace reads the requests Run will send (all of them, or the first
// Requests), returning the first malformed line's *trace.LineError unless
// SkipBad is set. It holds one line at a time.
func checkTrace(a *Config) error {
	rc, err := a.Open()
	if err != nil {
		return fmt.Errorf("benchserve: %w", err)
	}
	defer rc.Close()
	rd := trace.NewReader(rc, trace.Options{Format: a.Format, Name: a.Trace, SkipBad: a.SkipBad})
	var tr trace.Request
	for i := 0; a.Requests == 0 || i < a.Requests; i++ {
		if err := rd.Next(&tr); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
	return nil
}

// dispatch reads the trace and hands each request to launch, in order, until
// the trace ends, --requests are sent, the context ends, or launch returns
// false.
func dispatch(ctx context.Context, rd *trace.Reader, a *Config, pm *promptMaker, col *collector, launch func(job) bool) error {
	var tr trace.Request
	for i := 0; a.Requests == 0 || i < a.Requests; i++ {
		if ctx.Err() != nil {
			return nil
		}
		err := rd.Next(&tr)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		toks, cut := pm.make(&tr)
		if cut {
			col.cutPrompt()
		}
		maxTokens := max(tr.OutputTokens, 1)
		if a.MaxTokens > 0 {
			maxTokens = min(maxTokens, a.MaxTokens)
		}
		zero := 0.0
		j := job{index: i, arrival: tr.Arrival, req: openai.CompletionRequest{
			Model: a.Model, Prompt: openai.TokenPrompt(toks), MaxTokens: &maxTokens, Temperature: &zero,
			ReturnTokenIDs: true}}
		if verified(a, i) && a.VerifyLogprobs > 0 {
			k := a.VerifyLogprobs
			j.req.Logprobs = &k // the reference is sent with the same
		}
		if tr.Salt != 0 {
			j.req.Salt = strconv.FormatUint(tr.Salt, 10)
		}
		if !launch(j) {
			return nil
		}
	}
	return nil
}

// sendOne sends j, and with --verify, every Nth request again with no
// cache, comparing the two answers.
func sendOne(ctx context.Context, client *openai.Client, a *Config, j job) outcome {
	rctx, cancel := context.WithTimeout(ctx, a.Timeout)
	defer cancel()
	var o outcome
	o.res, o.err = client.Complete(rctx, j.req)
	if o.err != nil {
		o.cancelled = ctx.Err() != nil
		return o
	}
	if !verified(a, j.index) {
		return o
	}
	ref := j.req
	ref.NoCache = true
	refRes, err := client.Complete(rctx, ref)
	if err != nil {
		if ctx.Err() == nil {
			o.verifyErr = err
		}
		return o
	}
	o.verified, o.refTokens = true, refRes.TokenCount
	o.mismatch, o.drift = compareAnswers(j.index, o.res, refRes, a.VerifyTolerance)
	return o
}

// verified reports whether request index is one --verify compares.
func verified(a *Config, index int) bool { return a.Verify > 0 && index%a.Verify == a.Verify-1 }

// Mismatch is a cached answer that differs from its no-cache reference.
type Mismatch struct {
	Request int `json:"request"`
	// Position is the first generated token that differs.
	Position     int `json:"position"`
	CachedTokens int `json:"cached_tokens"`
	Tokens       int `json:"tokens"`
	RefTokens    int `json:"reference_tokens"`
	// Gap is, at Position, the larger of the two answers' margins (nats)
	// between their own token and the other's, -1 when it cannot be told
	// (no logprobs there, or the other's token not among the top ones);
	// Tie reports Gap within the tolerance.
	Gap float64 `json:"gap"`
	Tie bool    `json:"tie"`
}

// compareAnswers compares the generated token ids (the text, when the
// server sent no ids) of a cached answer and its reference, with tol the
// near-tie tolerance in nats. It returns the mismatch (nil when equal) and
// the largest logprob drift of a token both chose before it.
func compareAnswers(index int, got, ref *openai.Result, tol float64) (*Mismatch, float64) {
	m := &Mismatch{Request: index, Tokens: got.TokenCount, RefTokens: ref.TokenCount, Position: -1, Gap: -1}
	if got.Usage != nil && got.Usage.PromptTokensDetails != nil {
		m.CachedTokens = got.Usage.PromptTokensDetails.CachedTokens
	}
	drift := 0.0
	if len(got.Tokens) > 0 || len(ref.Tokens) > 0 {
		for i := range max(len(got.Tokens), len(ref.Tokens)) {
			if i >= len(got.Tokens) || i >= len(ref.Tokens) || got.Tokens[i] != ref.Tokens[i] {
				m.Position = i
				if i < len(got.Tokens) && i < len(ref.Tokens) {
					m.Gap = tieGap(got, ref, i)
					m.Tie = NearTie(m.Gap, tol)
				}
				return m, drift
			}
			if i < len(got.Logprobs) && i < len(ref.Logprobs) {
				drift = max(drift, math.Abs(got.Logprobs[i].Logprob-ref.Logprobs[i].Logprob))
			}
		}
		return nil, drift
	}
	if got.Text != ref.Text {
		for i := range max(len(got.Text), len(ref.Text)) {
			if i >= len(got.Text) || i >= len(ref.Text) || got.Text[i] != ref.Text[i] {
				m.Position = i // a byte offset: the server sent no ids
				return m, 0
			}
		}
	}
	return nil, 0
}

// tieGap returns, at position i where got and ref chose different tokens,
// the larger of the margins by which each answer preferred its own token to
// the other's; -1 when an answer has no logprobs there or does not list
// the other's token among its top ones.
func tieGap(got, ref *openai.Result, i int) float64 {
	if i >= len(got.Logprobs) || i >= len(ref.Logprobs) {
		return -1
	}
	margin := func(lp openai.TokenLogprob, other int32) float64 {
		for _, t := range lp.Top {
			if t.ID == other {
				return max(0, lp.Logprob-t.Logprob)
			}
		}
		return -1
	}
	a, b := margin(got.Logprobs[i], ref.Tokens[i]), margin(ref.Logprobs[i], got.Tokens[i])
	if a < 0 || b < 0 {
		return -1
	}
	return TieGap(a, b)
}

// DefaultVerifyTolerance is the near-tie tolerance --verify uses unless
// told otherwise, in nats: about twice the largest drift of a shared
// token's logprob measured between cached and no-cache answers on the
// H200 (0.055).
const DefaultVerifyTolerance = 0.1

// TieGap is the near-tie rule's measure at the first position where two
// greedy answers chose different tokens: the larger of the margins by
// which each answer preferred its own token to the other's, each in its
// own distribution (log-probabilities or logits: a difference is the same
// in both). A margin below 0 (rounding) counts as 0.
func TieGap(gotMargin, refMargin float64) float64 { return max(0, gotMargin, refMargin) }

// NearTie reports whether a first difference of gap (TieGap; below 0 when
// it could not be told) is a near tie under tol nats: a flip that rounding
// alone can cause, counted apart from a real difference.
func NearTie(gap, tol float64) bool { return gap >= 0 && gap <= tol }

// errorKey names an error's kind in the report: the HTTP status, "stream"
// for an error event inside a stream, "timeout", or "transport".
func errorKey(err error) string {
	var se *openai.StatusError
	switch {
	case errors.As(err, &se) && se.InStream:
		return "stream"
	case errors.As(err, &se):
		return strconv.Itoa(se.Status)
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "transport"
}

// collector gathers the outcomes; it is safe for concurrent use.
type collector struct {
	mu                sync.Mutex
	sent, completed   int
	cancelled         int
	cut               int
	errors            map[string]int
	errorSamples      map[string]string
	ttft, itl, e2e    []time.Duration
	promptTokens      int64
	completionTokens  int64
	cached            openai.TierTokens
	cachedTotal       int64
	recomputed        int64
	withUsage, byTier int
	verify            *VerifyReport
	// server: the queue, prefill, forward and handling of the requests
	// that reported a server_timing (ServerTimingReport).
	server     [4][]time.Duration
	perRequest bool
	records    []RequestRecord
}

func newCollector(a *Config) *collector {
	c := &collector{errors: map[string]int{}, errorSamples: map[string]string{}, perRequest: a.PerRequest}
	if a.Verify > 0 {
		c.verify = &VerifyReport{Every: a.Verify, TopLogprobs: a.VerifyLogprobs, Tolerance: a.VerifyTolerance}
	}
	return c
}

// record keeps j's outcome with Config.PerRequest; the caller holds c.mu.
func (c *collector) record(j *job, o *outcome) {
	if !c.perRequest {
		return
	}
	rec := RequestRecord{Index: j.index, ArrivalSeconds: j.arrival.Seconds(), SentSeconds: o.sent.Seconds(),
		PromptTokens: len(j.req.Prompt.Tokens), Cancelled: o.cancelled}
	switch {
	case o.err != nil && !o.cancelled:
		rec.Error = o.err.Error()
	case o.res != nil:
		r := o.res
		rec.TTFTSeconds, rec.LatencySeconds, rec.Tokens = r.TTFT.Seconds(), r.Latency.Seconds(), r.TokenCount
		if u := r.Usage; u != nil && u.PromptTokensDetails != nil {
			d := u.PromptTokensDetails
			rec.CachedTokens, rec.ByTier, rec.RecomputedTokens = d.CachedTokens, d.CachedTokensByTier, d.RecomputedTokens
		}
		if u := r.Usage; u != nil {
			rec.ServerTiming = u.ServerTiming
		}
	}
	c.records = append(c.records, rec)
}

func (c *collector) cutPrompt() {
	c.mu.Lock()
	c.cut++
	c.mu.Unlock()
}

func (c *collector) add(j *job, o outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.record(j, &o)
	c.sent++
	switch {
	case o.cancelled:
		c.cancelled++
		return
	case o.err != nil:
		k := errorKey(o.err)
		c.errors[k]++
		if _, ok := c.errorSamples[k]; !ok {
			c.errorSamples[k] = fmt.Sprintf("request %d: %v", j.index, o.err)
		}
		return
	}
	r := o.res
	c.completed++
	if r.TokenCount > 0 {
		c.ttft = append(c.ttft, r.TTFT)
	}
	c.itl = append(c.itl, r.InterToken...)
	c.e2e = append(c.e2e, r.Latency)
	c.promptTokens += int64(len(j.req.Prompt.Tokens))
	c.completionTokens += int64(r.TokenCount)
	if u := r.Usage; u != nil {
		c.withUsage++
		if st := u.ServerTiming; st != nil && r.TokenCount > 0 {
			sec := func(s float64) time.Duration { return time.Duration(s * 1e9) }
			for i, s := range []float64{st.QueueSeconds, st.PrefillSeconds, st.ForwardSeconds, st.HandlingSeconds(r.TTFT.Seconds())} {
				c.server[i] = append(c.server[i], sec(s))
			}
		}
		if d := u.PromptTokensDetails; d != nil {
			c.cachedTotal += int64(d.CachedTokens)
			c.recomputed += int64(d.RecomputedTokens)
			if t := d.CachedTokensByTier; t != nil {
				c.byTier++
				c.cached.GPU += t.GPU
				c.cached.Host += t.Host
				c.cached.NVMe += t.NVMe
			}
		}
	}
	if v := c.verify; v != nil {
		switch {
		case o.verifyErr != nil:
			v.Errors++
			if v.ErrorSample == "" {
				v.ErrorSample = fmt.Sprintf("request %d: %v", j.index, o.verifyErr)
			}
		case o.verified:
			v.countCompared(o)
		}
	}
}

// maxMismatchExamples is how many differing answers the report lists.
const maxMismatchExamples = 8
