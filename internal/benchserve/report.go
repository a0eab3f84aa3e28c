package benchserve

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"kvtier.dev/internal/openai"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/trace"
)

// Report is a run's outcome. Latencies are results.Percentiles
// (seconds), as kvtier replay reports them, so that a replay's prediction
// and a measurement of the same trace read side by side.
type Report struct {
	URL          string `json:"url"`
	Trace        string `json:"trace"`
	Format       string `json:"format"`
	SkippedLines int    `json:"skipped_lines"`
	// Load is "trace arrivals at speed S" or "concurrency N".
	Load string `json:"load"`
	// Prompts are the settings that decide what was sent, so that a run can
	// be repeated against another server.
	Prompts     PromptSettings `json:"prompts"`
	WallSeconds float64        `json:"wall_s"`
	// Sent requests ended as Completed, Cancelled (the run ended first) or
	// one of Errors, keyed by HTTP status, "stream" (an error event after
	// the stream began), "timeout" (--timeout) or "transport".
	Sent         int               `json:"sent"`
	Completed    int               `json:"completed"`
	Cancelled    int               `json:"cancelled"`
	Errors       map[string]int    `json:"errors"`
	ErrorSamples map[string]string `json:"error_samples,omitempty"`
	// CutPrompts were cut to --max-prompt-tokens.
	CutPrompts int `json:"cut_prompts,omitempty"`

	RequestsPerSecond     float64 `json:"requests_per_s"`
	InputTokensPerSecond  float64 `json:"input_tokens_per_s"`
	OutputTokensPerSecond float64 `json:"output_tokens_per_s"`
	PromptTokens          int64   `json:"prompt_tokens"`
	CompletionTokens      int64   `json:"completion_tokens"`

	TTFT       results.Percentiles `json:"ttft"`
	InterToken results.Percentiles `json:"inter_token"`
	Latency    results.Percentiles `json:"latency"`

	Cache CacheReport `json:"cache"`
	// Server is the server's own account of the TTFTs, from the requests
	// whose usage carried a server_timing (kvtier's model server sends
	// it); nil when none did.
	Server *ServerTimingReport `json:"server_timing,omitempty"`
	// Verify is set with --verify.
	Verify *VerifyReport `json:"verify,omitempty"`
	// Requests has one record per request sent, in dispatch order, with
	// Config.PerRequest.
	Requests []RequestRecord `json:"requests,omitempty"`

	ttftQ, itlQ []float64 // 0th to 100th percentiles, seconds, for plot
}

// ServerTimingReport splits the TTFTs of the Requests that reported a
// server_timing: the server's Queue (parsed, waiting for the GPU),
// Prefill (lookup to first token) and Forward (the passes within it), and
// Handling, each TTFT less its queue and forward passes: HTTP, parsing and
// the cache's bookkeeping (kvtier replay --handling-time models it).
type ServerTimingReport struct {
	Requests int                 `json:"requests"`
	Queue    results.Percentiles `json:"queue"`
	Prefill  results.Percentiles `json:"prefill"`
	Forward  results.Percentiles `json:"forward"`
	Handling results.Percentiles `json:"handling"`
}

// PromptSettings are the Config fields that decide the requests sent.
type PromptSettings struct {
	Model           string `json:"model,omitempty"`
	Vocab           int    `json:"vocab"`
	Seed            uint64 `json:"seed"`
	BlockTokens     int    `json:"block_tokens,omitempty"`
	MaxPromptTokens int    `json:"max_prompt_tokens,omitempty"`
	MaxTokens       int    `json:"max_tokens,omitempty"`
	Requests        int    `json:"requests,omitempty"`
}

// CacheReport sums the usage the server reported for completed requests.
type CacheReport struct {
	// RequestsWithUsage sent a usage; RequestsWithTiers also split its
	// cached tokens per tier (kvtier's extension).
	RequestsWithUsage int               `json:"requests_with_usage"`
	RequestsWithTiers int               `json:"requests_with_tiers"`
	CachedTokens      int64             `json:"cached_tokens"`
	ByTier            openai.TierTokens `json:"cached_tokens_by_tier"`
	RecomputedTokens  int64             `json:"recomputed_tokens"`
	// CachedFraction is CachedTokens over the prompt tokens of completed
	// requests.
	CachedFraction float64 `json:"cached_fraction"`
}

// RequestRecord is one request's outcome (Config.PerRequest): where it sat
// in the trace, when it was sent, what it measured and what the server
// reported of its prompt's KV.
type RequestRecord struct {
	// Index is the request's position in the trace (dispatch order, from
	// 0); ArrivalSeconds its arrival in the trace, before --speed.
	Index          int     `json:"index"`
	ArrivalSeconds float64 `json:"arrival_s"`
	// SentSeconds is when it was sent, from the run's start.
	SentSeconds    float64 `json:"sent_s"`
	TTFTSeconds    float64 `json:"ttft_s"`
	LatencySeconds float64 `json:"latency_s"`
	PromptTokens   int     `json:"prompt_tokens"`
	Tokens         int     `json:"tokens"`
	// CachedTokens by tier and RecomputedTokens are the server's usage.
	CachedTokens     int                `json:"cached_tokens"`
	ByTier           *openai.TierTokens `json:"cached_tokens_by_tier,omitempty"`
	RecomputedTokens int                `json:"recomputed_tokens"`
	// ServerTiming is the server's own account of the request's time to
	// first token (openai.ServerTiming: kvtier's model server sends it),
	// nil when it sent none.
	ServerTiming *openai.ServerTiming `json:"server_timing,omitempty"`
	// Error is set for a request that failed; Cancelled for one the run's
	// end cut short.
	Error     string `json:"error,omitempty"`
	Cancelled bool   `json:"cancelled,omitempty"`
}

// VerifyReport is --verify's outcome. A cached answer and its no-cache
// reference can differ without any KV being wrong: the cached prefix's KV
// was computed in other passes, of other shapes, whose bf16 products round
// differently, and a greedy choice between two tokens closer than that
// rounding flips. With logprobs the first differing token is told apart: a
// near tie (within Tolerance in both answers) or a difference.
type VerifyReport struct {
	Every    int `json:"every"`
	Compared int `json:"compared"`
	// Tokens is the generated tokens of the compared references.
	Tokens int `json:"tokens"`
	// Agreement is the share of compared answers whose tokens all equal
	// the reference's; AgreementWithTies also counts those whose first
	// difference was a near tie. Both 0 when none were compared.
	Agreement         float64 `json:"agreement"`
	AgreementWithTies float64 `json:"agreement_with_ties"`
	// Reused is the compared answers whose usage reported cached prompt
	// tokens (an answer computed without any tells nothing of served KV),
	// CachedMin and CachedMax their fewest and most; ReusedAgree of them
	// equal their reference and ReusedTies differ first at a near tie;
	// ReusedAgreement and ReusedAgreementWithTies are the shares.
	Reused                  int     `json:"reused"`
	CachedMin               int     `json:"cached_tokens_min"`
	CachedMax               int     `json:"cached_tokens_max"`
	ReusedAgree             int     `json:"reused_agree"`
	ReusedTies              int     `json:"reused_ties"`
	ReusedAgreement         float64 `json:"reused_agreement"`
	ReusedAgreementWithTies float64 `json:"reused_agreement_with_ties"`
	// Mismatches are answers whose tokens differ from the reference's;
	// Ties of them differed first at a near tie, Differences did not (or
	// could not be told: no logprobs, or a token outside the other's top).
	Mismatches  int `json:"mismatches"`
	Ties        int `json:"ties"`
	Differences int `json:"differences"`
	// TopLogprobs and Tolerance (nats) are the settings; MaxDrift is the
	// largest difference between the two answers' log-probabilities of a
	// token both chose, before their first difference: the rounding noise.
	TopLogprobs int        `json:"top_logprobs"`
	Tolerance   float64    `json:"tolerance"`
	MaxDrift    float64    `json:"max_drift"`
	Errors      int        `json:"errors"`
	ErrorSample string     `json:"error_sample,omitempty"`
	Examples    []Mismatch `json:"examples,omitempty"`
}

// countCompared counts a cached answer compared with its reference.
func (v *VerifyReport) countCompared(o outcome) {
	cached := 0
	if u := o.res.Usage; u != nil && u.PromptTokensDetails != nil {
		cached = u.PromptTokensDetails.CachedTokens
	}
	m := o.mismatch
	v.Compared++
	v.Tokens += o.refTokens
	v.MaxDrift = max(v.MaxDrift, o.drift)
	if m != nil {
		v.Mismatches++
		if m.Tie {
			v.Ties++
		} else {
			v.Differences++
		}
		if len(v.Examples) < maxMismatchExamples {
			v.Examples = append(v.Examples, *m)
		}
	}
	v.Agreement = float64(v.Compared-v.Mismatches) / float64(v.Compared)
	v.AgreementWithTies = float64(v.Compared-v.Differences) / float64(v.Compared)
	if cached == 0 {
		return
	}
	if v.Reused == 0 || cached < v.CachedMin {
		v.CachedMin = cached
	}
	v.CachedMax = max(v.CachedMax, cached)
	v.Reused++
	switch {
	case m == nil:
		v.ReusedAgree++
	case m.Tie:
		v.ReusedTies++
	}
	v.ReusedAgreement = float64(v.ReusedAgree) / float64(v.Reused)
	v.ReusedAgreementWithTies = float64(v.ReusedAgree+v.ReusedTies) / float64(v.Reused)
}

// report turns the collected outcomes into the report.
func (c *collector) report(a *Config, rd *trace.Reader, wall time.Duration) *Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := &Report{URL: a.URL, Trace: a.Trace, Format: rd.Format().String(), SkippedLines: rd.Skipped(),
		WallSeconds: wall.Seconds(), Sent: c.sent, Completed: c.completed, Cancelled: c.cancelled,
		Errors: c.errors, ErrorSamples: c.errorSamples, CutPrompts: c.cut,
		PromptTokens: c.promptTokens, CompletionTokens: c.completionTokens, Verify: c.verify, Requests: c.records}
	r.Prompts = PromptSettings{Model: a.Model, Vocab: a.Vocab, Seed: a.Seed, BlockTokens: a.BlockTokens,
		MaxPromptTokens: a.MaxPromptTokens, MaxTokens: a.MaxTokens, Requests: a.Requests}
	if a.Concurrency > 0 {
		r.Load = fmt.Sprintf("concurrency %d", a.Concurrency)
	} else {
		r.Load = fmt.Sprintf("trace arrivals at speed %g", a.Speed)
	}
	if s := wall.Seconds(); s > 0 {
		r.RequestsPerSecond = float64(c.completed) / s
		r.InputTokensPerSecond = float64(c.promptTokens) / s
		r.OutputTokensPerSecond = float64(c.completionTokens) / s
	}
	slices.SortFunc(c.records, func(x, y RequestRecord) int { return x.Index - y.Index })
	for _, ds := range [][]time.Duration{c.ttft, c.itl, c.e2e} {
		slices.Sort(ds)
	}
	r.TTFT, r.ttftQ = percentiles(c.ttft)
	r.InterToken, r.itlQ = percentiles(c.itl)
	r.Latency, _ = percentiles(c.e2e)
	if len(c.server[0]) > 0 {
		st := &ServerTimingReport{Requests: len(c.server[0])}
		for i, p := range []*results.Percentiles{&st.Queue, &st.Prefill, &st.Forward, &st.Handling} {
			slices.Sort(c.server[i])
			*p, _ = percentiles(c.server[i])
		}
		r.Server = st
	}
	r.Cache = CacheReport{RequestsWithUsage: c.withUsage, RequestsWithTiers: c.byTier, CachedTokens: c.cachedTotal,
		ByTier: c.cached, RecomputedTokens: c.recomputed}
	if c.promptTokens > 0 {
		r.Cache.CachedFraction = float64(c.cachedTotal) / float64(c.promptTokens)
	}
	return r
}

// percentiles returns the nearest-rank percentiles of sorted ds, and its
// 0th to 100th percentiles for the plots.
func percentiles(ds []time.Duration) (results.Percentiles, []float64) {
	if len(ds) == 0 {
		return results.Percentiles{}, nil
	}
	q := make([]float64, 101)
	for i := range q {
		q[i] = results.Quantile(ds, float64(i)/100)
	}
	return results.PercentilesOf(ds), q
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report as a table.
func (r *Report) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "bench-serve %s\n", r.URL)
	fmt.Fprintf(w, "trace %s (%s", r.Trace, r.Format)
	if r.SkippedLines > 0 {
		fmt.Fprintf(w, ", %d bad lines skipped", r.SkippedLines)
	}
	fmt.Fprintf(w, "), %s, %.2f s\n", r.Load, r.WallSeconds)
	fmt.Fprintf(w, "requests: %d sent, %d completed, %d cancelled at the end, %d failed", r.Sent, r.Completed, r.Cancelled, r.Sent-r.Completed-r.Cancelled)
	if r.CutPrompts > 0 {
		fmt.Fprintf(w, ", %d prompts cut", r.CutPrompts)
	}
	fmt.Fprintln(w)
	if len(r.Errors) > 0 {
		keys := make([]string, 0, len(r.Errors))
		for k := range r.Errors {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "  error %-9s %6d  e.g. %s\n", k, r.Errors[k], r.ErrorSamples[k])
		}
	}
	fmt.Fprintf(w, "throughput: %.2f req/s, %.0f input tokens/s, %.1f output tokens/s\n\n",
		r.RequestsPerSecond, r.InputTokensPerSecond, r.OutputTokensPerSecond)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tp50\tp90\tp99\tmean\tmax\t")
	type row struct {
		name string
		p    results.Percentiles
	}
	rows := []row{{"TTFT", r.TTFT}, {"inter-token", r.InterToken}, {"latency", r.Latency}}
	if st := r.Server; st != nil {
		rows = append(rows, row{"server queue", st.Queue}, row{"server prefill", st.Prefill},
			row{"server forward", st.Forward}, row{"handling", st.Handling})
	}
	for _, row := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", row.name, ms(row.p.P50), ms(row.p.P90), ms(row.p.P99), ms(row.p.Mean), ms(row.p.Max))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	c := r.Cache
	fmt.Fprintf(w, "\ncached prompt tokens: %d of %d (%.1f%%) from %d usage reports", c.CachedTokens, r.PromptTokens, 100*c.CachedFraction, c.RequestsWithUsage)
	if c.RequestsWithTiers > 0 {
		fmt.Fprintf(w, "; gpu %d, host %d, nvme %d; recomputed %d", c.ByTier.GPU, c.ByTier.Host, c.ByTier.NVMe, c.RecomputedTokens)
	}
	fmt.Fprintln(w)
	if v := r.Verify; v != nil {
		fmt.Fprintf(w, "verify (every %d): %d compared, %d differ: %d near ties (within %g nats), %d differences; %d reference requests failed; largest drift of a shared token's logprob %.4f nats\n",
			v.Every, v.Compared, v.Mismatches, v.Ties, v.Tolerance, v.Differences, v.Errors, v.MaxDrift)
		fmt.Fprintf(w, "  agreement: %.4f of answers token for token, %.4f with near ties, over %d reference tokens; of the %d that reused %d-%d cached prompt tokens: %.4f, %.4f with near ties\n",
			v.Agreement, v.AgreementWithTies, v.Tokens, v.Reused, v.CachedMin, v.CachedMax, v.ReusedAgreement, v.ReusedAgreementWithTies)
		for _, m := range v.Examples {
			kind := "difference"
			if m.Tie {
				kind = "near tie"
			}
			gap := "unknown"
			if m.Gap >= 0 {
				gap = fmt.Sprintf("%.4f nats", m.Gap)
			}
			fmt.Fprintf(w, "  request %d: first difference at token %d, a %s (gap %s; %d cached prompt tokens; %d tokens against %d)\n",
				m.Request, m.Position, kind, gap, m.CachedTokens, m.Tokens, m.RefTokens)
		}
		if v.ErrorSample != "" {
			fmt.Fprintf(w, "  e.g. %s\n", v.ErrorSample)
		}
	}
	return nil
}

// ms formats seconds as milliseconds, to 10 us below 10 ms.
func ms(s float64) string {
	if s < 0.010 {
		return fmt.Sprintf("%.2f ms", s*1000)
	}
	return fmt.Sprintf("%.1f ms", s*1000)
}

// Plot draws the TTFT and inter-token latency distributions into dir, as
// ttft.{svg,png} and inter-token.{svg,png}, and returns the files written.
func (r *Report) Plot(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("benchserve: plot: %w", err)
	}
	var files []string
	for _, p := range []struct {
		name, title, axis string
		q                 []float64
	}{
		{"ttft", "Time to first token", "TTFT (s)", r.ttftQ},
		{"inter-token", "Inter-token latency", "time between tokens (s)", r.itlQ},
	} {
		pl, err := cdfPlot(p.title+": "+r.Trace, p.axis, p.q)
		if err != nil {
			return files, fmt.Errorf("benchserve: plot: %w", err)
		}
		for _, ext := range []string{"svg", "png"} {
			f := filepath.Join(dir, p.name+"."+ext)
			if err := pl.Save(7*vg.Inch, 4.5*vg.Inch, f); err != nil {
				return files, fmt.Errorf("benchserve: plot: %w", err)
			}
			files = append(files, f)
		}
	}
	return files, nil
}

// cdfPlot draws quantiles q (seconds, 0th to 100th percentile) as a
// cumulative distribution on a logarithmic time axis.
func cdfPlot(title, axis string, q []float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = axis
	p.Y.Label.Text = "fraction"
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	floor := 1e-6
	for _, v := range q {
		if v > 0 {
			floor = v
			break
		}
	}
	pts := make(plotter.XYs, 0, len(q))
	for i, v := range q {
		pts = append(pts, plotter.XY{X: max(v, floor), Y: float64(i) / 100})
	}
	if len(pts) == 0 {
		return p, nil // no data: axes only
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, err
	}
	l.Width = vg.Points(1.5)
	p.Add(l)
	return p, nil
}
