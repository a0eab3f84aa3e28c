package cost

import "time"

// PrefillCost prices one model's prefills on tp GPUs of one kind; it is a
// small value, built by (*Fit).PrefillCost or PresetPrefillCost:
//
//	prefill(n tokens after p present) = max(Floor, Pass + p·PrefixRead + n·PerToken + n(n+1)/2·PerPair + p·max(0, n - R)·PerPrefixPair)
//
// R (PrefixFullRows) is the rows at which the prefix attention fills the
// GPU: a flash kernel runs a CTA per tile of query rows and head, so a
// pass of fewer rows still sweeps the whole prefix once, on fewer SMs, in
// about the time of R rows; that sweep is in the read term, p·PrefixRead,
// and the prefix pairs count from row R on. R is 0 under the presets (the
// pairs count from the first row) and comes from the runtime with a
// calibration (PrefillFit.AttentionWave): 528 for llama-3.1-8b's 32 heads
// on the H200's 132 SMs with the server's 128-row tiles.
type PrefillCost struct {
	PassSeconds               float64 // once per prefill; 0 under the presets
	LinearSecondsPerToken     float64 // per token computed
	AttentionSecondsPerPair   float64 // per pair among the tokens computed
	PrefixSecondsPerPair      float64 // per pair with a present token
	PrefixReadSecondsPerToken float64 // per token present; 0 under the presets
	FloorSeconds              float64 // Scenario.PassFloor
	LoadSlowdown              float64 // PrefillFit.LoadSlowdown; 0 under the presets
	PrefixFullRows            float64 // R above; 0 under the presets
}

// PresetPrefillCost is FLOPs over tp × EffectiveFLOPS, and the HBM floor.
func PresetPrefillCost(m *Model, g *GPU, tp int) PrefillCost {
	tp = max(1, tp)
	f := g.EffectiveFLOPS() * float64(tp)
	return PrefillCost{
		LinearSecondsPerToken:   2 * m.ActiveParams / f,
		AttentionSecondsPerPair: m.attentionFLOPsPerPair() / f,
		PrefixSecondsPerPair:    m.attentionFLOPsPerPair() / f,
		FloorSeconds:            floorSeconds(m, g, tp),
	}
}

func floorSeconds(m *Model, g *GPU, tp int) float64 {
	if !(g.HBMBytesPerS > 0) {
		return 0
	}
	return float64(m.WeightBytesPerRank(tp)) / g.HBMBytesPerS
}

// MarginalSeconds is the work n tokens after p present add to a pass that
// has filled the GPU already: every pair with a present token at the
// per-pair rate. It is what the Planner weighs a block's recompute by (an
// upper bound on what it adds to a short pass); Seconds prices whole
// passes.
func (c *PrefillCost) MarginalSeconds(tokens, prefix int) float64 {
	if tokens <= 0 {
		return 0
	}
	n, p := float64(tokens), float64(prefix)
	return n*c.LinearSecondsPerToken + n*(n+1)/2*c.AttentionSecondsPerPair + n*p*c.PrefixSecondsPerPair
}

// BlockSeconds is what tokens add to a pass after computedBefore computed
// and presentBefore present tokens: their pairs with the present tokens
// count for their rows past PrefixFullRows. Over the blocks of a prefill
// of n tokens after p present it sums to Seconds' compute.
func (c *PrefillCost) BlockSeconds(tokens, computedBefore, presentBefore int) float64 {
	if tokens <= 0 {
		return 0
	}
	n, before := float64(tokens), float64(max(0, computedBefore))
	rows := max(0, before+n-c.PrefixFullRows) - max(0, before-c.PrefixFullRows)
	return n*c.LinearSecondsPerToken + (n*(n+1)/2+n*before)*c.AttentionSecondsPerPair +
		rows*float64(max(0, presentBefore))*c.PrefixSecondsPerPair
}

// PassEndSeconds is the pass cost and the read of present tokens.
func (c *PrefillCost) PassEndSeconds(present int) float64 {
	return c.PassSeconds + float64(max(0, present))*c.PrefixReadSecondsPerToken
}

// Seconds is a whole prefill of n tokens after p present, floor included.
func (c *PrefillCost) Seconds(tokens, prefix int) float64 {
	return max(c.FloorSeconds, c.PassEndSeconds(prefix)+c.BlockSeconds(tokens, 0, prefix))
}

// Time is Seconds as a Duration.
func (c *PrefillCost) Time(tokens, prefix int) time.Duration {
	return seconds(c.Seconds(tokens, prefix))
}

// SlowdownSeconds is how much later a pass of work seconds ends because
// its loads copy into the GPU for overlap seconds of it: LoadSlowdown ×
// the time they run together (PrefillFit.LoadSlowdown). The Planner
// prices a pass's end by it, and the replay runs one by it.
func (c *PrefillCost) SlowdownSeconds(work, overlap float64) float64 {
	return c.LoadSlowdown * max(0, min(work, overlap))
}

// SlowdownTime is SlowdownSeconds of Durations.
func (c *PrefillCost) SlowdownTime(work, overlap time.Duration) time.Duration {
	return seconds(c.SlowdownSeconds(work.Seconds(), overlap.Seconds()))
}

// MarginalTime is MarginalSeconds as a Duration.
func (c *PrefillCost) MarginalTime(tokens, prefix int) time.Duration {
	return seconds(c.MarginalSeconds(tokens, prefix))
}
