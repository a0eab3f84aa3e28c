package cost

import (
	"fmt"
	"math"
	"time"
)

// Scenario is one model on tp GPUs of one kind, with its cached KV reachable
// over Path. It answers the per-request questions: how long to reload, how
// long to recompute, which is cheaper, where they break even and how to
// split the work between them.
type Scenario struct {
	Model Model
	GPU   GPU
	// TP is the tensor-parallel degree: prefill runs on TP GPUs at once, and
	// each GPU reloads its own shard of the KV over its own Path.
	TP   int
	Path Path
	// Fit, when set, prices prefill by a Calibration's fit instead of the
	// presets (RecomputeTime is then its marginal cost: the work recompute
	// adds to the pass the request runs anyway).
	Fit *Fit
}

// Validate checks every part; the error names the field.
func (s *Scenario) Validate() error {
	if err := s.Model.Validate(); err != nil {
		return err
	}
	if err := s.GPU.Validate(); err != nil {
		return err
	}
	if err := checkTP(s.TP); err != nil {
		return err
	}
	return s.Path.Validate()
}

// KVBytes is the KV of n tokens, all ranks together.
func (s *Scenario) KVBytes(tokens int) int64 { return s.Model.KVBytesPerToken() * int64(tokens) }

// ReloadTime is the time to bring n tokens' KV back over Path: each rank
// moves its shard over its own link, all at once.
func (s *Scenario) ReloadTime(tokens int) time.Duration {
	return seconds(s.reloadSeconds(tokens))
}

func (s *Scenario) reloadSeconds(tokens int) float64 {
	if tokens <= 0 {
		return 0
	}
	bytes := float64(s.Model.KVBytesPerTokenPerRank(s.TP)) * float64(tokens)
	return s.Path.latencySeconds() + bytes*s.Path.secondsPerByte()
}

// RecomputeFLOPs splits the prefill work of n tokens after p present ones
// into its linear part (2 × ActiveParams × n) and its causal attention part
// (see the package comment).
func (m *Model) RecomputeFLOPs(tokens, prefix int) (linear, attention float64) {
	n, p := float64(tokens), float64(prefix)
	linear = 2 * m.ActiveParams * n
	attention = m.attentionFLOPsPerPair() * (n*p + n*(n+1)/2)
	return linear, attention
}

// RecomputeTime is the prefill time of n tokens after p present ones on TP
// GPUs. withAttention false gives the linear-only figure (the seed chapter's
// 2·N·tokens estimate), true adds causal attention.
func (s *Scenario) RecomputeTime(tokens, prefix int, withAttention bool) time.Duration {
	return seconds(s.recomputeSeconds(tokens, prefix, withAttention))
}

// PassFloor is the shortest a forward pass can be: each rank reads all of
// its weights from HBM once per pass, however few tokens it runs (Llama-3.1-8B
// on an H200: 16.1 GB over 4.8 TB/s, 3.3 ms). A request's prefill, cached or
// not, is at least one pass. Zero when the GPU's HBM bandwidth is unknown.
func (s *Scenario) PassFloor() time.Duration { return seconds(s.passFloorSeconds()) }

func (s *Scenario) passFloorSeconds() float64 {
	if !(s.GPU.HBMBytesPerS > 0) {
		return 0
	}
	return float64(s.Model.WeightBytesPerRank(s.TP)) / s.GPU.HBMBytesPerS
}

// CheckFits returns an error wrapping ErrDoesNotFit when one GPU of the
// group cannot hold its share of the weights beside kvBytes of KV cache; the
// error says how much KV would fit. A GPU of unknown memory fits anything.
func (s *Scenario) CheckFits(kvBytes int64) error {
	if s.GPU.MemoryBytes <= 0 {
		return nil
	}
	w := s.Model.WeightBytesPerRank(s.TP)
	if w+kvBytes > s.GPU.MemoryBytes {
		return fmt.Errorf("%w: %s's weights take %.1f GB per GPU at tp %d, and with %.1f GB of KV that is more than the %s's %.1f GB (at most %.1f GB of KV fits: lower the KV, or raise tp)",
			ErrDoesNotFit, s.Model.Name, float64(w)/1e9, max(1, s.TP), float64(kvBytes)/1e9, s.GPU.Name, float64(s.GPU.MemoryBytes)/1e9, float64(max(0, s.GPU.MemoryBytes-w))/1e9)
	}
	return nil
}

// prefillCost is the fit's, or the presets'.
func (s *Scenario) prefillCost() PrefillCost { return s.Fit.PrefillCost(&s.Model, &s.GPU, s.TP) }

func (s *Scenario) recomputeSeconds(tokens, prefix int, withAttention bool) float64 {
	if tokens <= 0 {
		return 0
	}
	c := s.prefillCost()
	if !withAttention {
		c.AttentionSecondsPerPair, c.PrefixSecondsPerPair = 0, 0
	}
	return c.MarginalSeconds(tokens, prefix)
}

// Choice is the answer to "reload or recompute?".
type Choice uint8

const (
	Reload Choice = iota
	Recompute
	NumChoices
)

func (c Choice) String() string {
	switch c {
	case Reload:
		return "reload"
	case Recompute:
		return "recompute"
	}
	return fmt.Sprintf("Choice(%d)", uint8(c))
}

// Split is "recompute the first RecomputeTokens while the other
// LoadTokens load": the recomputed prefix needs only the KV before it (the
// present prefix), and the loaded suffix needs nothing computed, so the two
// run at once and Time = max(recompute, reload). This is the scheme of
// "Compute Or Load KV Cache? Why Not Both?" (ICML'25).
type Split struct {
	RecomputeTokens int
	LoadTokens      int
	Time            time.Duration
}

// Decision is everything the calculator reports for one request.
type Decision struct {
	Tokens, Prefix         int
	KVBytes                int64
	Reload                 time.Duration
	RecomputeLinear        time.Duration // linear FLOPs only
	RecomputeWithAttention time.Duration // linear plus causal attention
	// Choice compares Reload with RecomputeWithAttention; ties reload
	// (it leaves the GPU free).
	Choice Choice
	Split  Split
}

// Decide answers for n tokens after p present ones. It rejects a negative
// prefix or a token count outside [1, 2^30].
func (s *Scenario) Decide(tokens, prefix int) (Decision, error) {
	if err := s.checkRequest(tokens, prefix); err != nil {
		return Decision{}, err
	}
	d := Decision{
		Tokens: tokens, Prefix: prefix, KVBytes: s.KVBytes(tokens),
		Reload:                 s.ReloadTime(tokens),
		RecomputeLinear:        s.RecomputeTime(tokens, prefix, false),
		RecomputeWithAttention: s.RecomputeTime(tokens, prefix, true),
	}
	if d.RecomputeWithAttention < d.Reload {
		d.Choice = Recompute
	}
	d.Split, _ = s.BestSplit(tokens, prefix)
	return d, nil
}

func (s *Scenario) checkRequest(tokens, prefix int) error {
	if err := checkTokens("tokens", tokens, 1); err != nil {
		return err
	}
	if err := checkTokens("prefix", prefix, 0); err != nil {
		return err
	}
	if tokens+prefix > maxTokens {
		return fieldErr("tokens", tokens, "tokens + prefix (%d) exceeds %d", tokens+prefix, maxTokens)
	}
	return nil
}

// BestSplit chooses k, the number of tokens to recompute first, minimising
// max(recompute(k after p), reload(n-k)). Recompute time rises with k and
// reload time falls, so the optimum sits where they cross: a binary search
// finds the smallest k whose recompute is at least its reload, and the
// answer is k or k-1, whichever is faster. O(log n).
func (s *Scenario) BestSplit(tokens, prefix int) (Split, error) {
	if err := s.checkRequest(tokens, prefix); err != nil {
		return Split{}, err
	}
	cost := func(k int) float64 {
		return math.Max(s.recomputeSeconds(k, prefix, true), s.reloadSeconds(tokens-k))
	}
	lo, hi := 0, tokens // smallest k in [lo, hi] with recompute(k) >= reload(n-k)
	for lo < hi {
		mid := lo + (hi-lo)/2
		if s.recomputeSeconds(mid, prefix, true) >= s.reloadSeconds(tokens-mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	best := lo
	if lo > 0 && cost(lo-1) <= cost(lo) {
		best = lo - 1
	}
	return Split{RecomputeTokens: best, LoadTokens: tokens - best, Time: seconds(cost(best))}, nil
}

// BreakEven is the context length from which reloading a prefix (nothing
// present before it) is at least as fast as recomputing it: the smallest n
// with reload(n) <= recompute(n). withAttention selects the recompute
// figure. ok is false when reload never wins (the link is slower per token
// than prefill). Solved in closed form: recompute(n) - reload(n) is
//
//	a·n² + b·n - c,  a = A/(2F), b = 2P/F + A/(2F) - β, c = latency
//
// (A/F the seconds per query-key pair, 2P/F the linear seconds per token,
// β the seconds per token of the path; a Fit's rates where set), a convex quadratic that
// is -c <= 0 at n = 0, so it has one non-negative root.
func (s *Scenario) BreakEven(withAttention bool) (tokens int, ok bool) {
	pc := s.prefillCost()
	perPair := 0.0
	if withAttention {
		perPair = pc.AttentionSecondsPerPair
	}
	beta := float64(s.Model.KVBytesPerTokenPerRank(s.TP)) * s.Path.secondsPerByte()
	a := perPair / 2
	b := pc.LinearSecondsPerToken + a - beta
	c := s.Path.latencySeconds()
	var root float64
	switch {
	case a > 0:
		root = (-b + math.Sqrt(b*b+4*a*c)) / (2 * a)
	case b > 0:
		root = c / b
	default:
		return 0, false
	}
	if root > maxTokens {
		return 0, false
	}
	n := int(math.Ceil(root))
	if n < 1 {
		n = 1
	}
	// The closed form is exact in reals; settle rounding on integers.
	for n > 1 && s.reloadSeconds(n-1) <= s.recomputeSeconds(n-1, 0, withAttention) {
		n--
	}
	for s.reloadSeconds(n) > s.recomputeSeconds(n, 0, withAttention) {
		n++
		if n > maxTokens {
			return 0, false
		}
	}
	return n, true
}
