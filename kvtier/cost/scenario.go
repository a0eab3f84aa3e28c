package cost

import (
	"fmt"
	"math"
	"time"
)

// Scenario is one model on TP GPUs of one kind, its cached KV reachable
// over Path. It answers one request's questions.
type Scenario struct {
	Model Model
	GPU   GPU
	TP    int // GPUs, each reloading its shard over its own Path
	Path  Path
	Fit   *Fit // when set, prices prefill instead of the presets
	// BlockTokens is the tokens per block (16) when Path.Codec is set: an
	// encoded block carries its own scales, so the blocks' size counts.
	// Unused without a codec.
	BlockTokens int
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
	if err := s.Path.Validate(); err != nil {
		return err
	}
	if s.Path.Codec.Enabled() {
		if err := s.Path.Codec.checkModel(&s.Model); err != nil {
			return err
		}
		if s.BlockTokens < 1 || s.BlockTokens > 1<<20 {
			return fieldErr("block_tokens", s.BlockTokens, "must be between 1 and %d with codec %s", 1<<20, s.Path.Codec.Name)
		}
	}
	return nil
}

// KVBytes is the KV of n tokens, all ranks together.
func (s *Scenario) KVBytes(tokens int) int64 { return s.Model.KVBytesPerToken() * int64(tokens) }

// ReloadTime brings n tokens' KV back over Path, every rank at once; with
// a codec, its encoded bytes, decoded on the GPU as they arrive (see
// Codec).
func (s *Scenario) ReloadTime(tokens int) time.Duration {
	return seconds(s.reloadSeconds(tokens))
}

// WireBytes is what n tokens' KV puts on each rank's path: encoded when
// Path.Codec is set.
func (s *Scenario) WireBytes(tokens int) int64 {
	if tokens <= 0 {
		return 0
	}
	if s.Path.Codec.Enabled() {
		return s.Path.Codec.encodedBytes(&s.Model, tokens, s.BlockTokens, s.TP)
	}
	return s.Model.KVBytesPerTokenPerRank(s.TP) * int64(tokens)
}

func (s *Scenario) reloadSeconds(tokens int) float64 {
	if tokens <= 0 {
		return 0
	}
	perToken := s.Model.KVBytesPerTokenPerRank(s.TP)
	raw := perToken * int64(tokens)
	if !s.Path.Codec.Enabled() {
		return s.Path.latencySeconds() + float64(raw)*s.Path.secondsPerByte()
	}
	chunk := perToken * int64(min(tokens, s.Path.Codec.ChunkBlocks*s.BlockTokens))
	return s.Path.codecLoadSeconds(raw, s.WireBytes(tokens), chunk)
}

// reloadLine is reloadSeconds as a line in n for the break-even's closed
// form: seconds per token and a fixed cost. With a codec, full blocks'
// encoded bytes and a full chunk's decode; the integer search settles the
// rest.
func (s *Scenario) reloadLine() (perToken, fixed float64) {
	raw := float64(s.Model.KVBytesPerTokenPerRank(s.TP))
	c := &s.Path.Codec
	if !c.Enabled() {
		return raw * s.Path.secondsPerByte(), s.Path.latencySeconds()
	}
	bt := float64(s.BlockTokens)
	enc := float64(c.EncodedBlockBytes(&s.Model, s.BlockTokens, s.TP)) / bt
	perToken = math.Max(enc*s.Path.secondsPerByte(), raw/c.DecodeBytesPerS)
	fixed = s.Path.latencySeconds() + raw*bt*float64(c.ChunkBlocks)/c.DecodeBytesPerS
	return perToken, fixed
}

// RecomputeFLOPs splits the prefill of n tokens after p present ones.
func (m *Model) RecomputeFLOPs(tokens, prefix int) (linear, attention float64) {
	n, p := float64(tokens), float64(prefix)
	linear = 2 * m.ActiveParams * n
	attention = m.attentionFLOPsPerPair() * (n*p + n*(n+1)/2)
	return linear, attention
}

// RecomputeTime is the prefill of n tokens after p present, with or
// without attention.
func (s *Scenario) RecomputeTime(tokens, prefix int, withAttention bool) time.Duration {
	return seconds(s.recomputeSeconds(tokens, prefix, withAttention))
}

// PassFloor is the shortest pass: the weights' read from HBM (0: unknown).
func (s *Scenario) PassFloor() time.Duration { return seconds(s.passFloorSeconds()) }

func (s *Scenario) passFloorSeconds() float64 {
	if !(s.GPU.HBMBytesPerS > 0) {
		return 0
	}
	return float64(s.Model.WeightBytesPerRank(s.TP)) / s.GPU.HBMBytesPerS
}

// CheckFits wraps ErrDoesNotFit, saying how much KV would fit, when a GPU
// of known memory cannot hold its weights beside kvBytes of KV.
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

// Split is: recompute the first RecomputeTokens while the rest load.
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
	Choice                 Choice        // Recompute if RecomputeWithAttention < Reload
	Split                  Split
}

// Decide answers for n in [1, 2^30] tokens after p >= 0 present.
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

// BestSplit is the Split of n tokens after p present with the least Time.
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

// BreakEven is the least n with reload(n) <= recompute(n) from scratch;
// ok is false when reload never wins.
func (s *Scenario) BreakEven(withAttention bool) (tokens int, ok bool) {
	pc := s.prefillCost()
	perPair := 0.0
	if withAttention {
		perPair = pc.AttentionSecondsPerPair
	}
	beta, c := s.reloadLine()
	a := perPair / 2
	b := pc.LinearSecondsPerToken + a - beta
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
