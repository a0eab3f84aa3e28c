package cost

import "time"

// PrefillCost prices one model's prefills on tp GPUs of one kind; it is a
// small value, built by (*Fit).PrefillCost or PresetPrefillCost:
//
//	prefill(n tokens after p present) = max(Floor, Pass + p·PrefixRead + n·PerToken + n(n+1)/2·PerPair + n·p·PerPrefixPair)
type PrefillCost struct {
	PassSeconds               float64 // once per prefill; 0 under the presets
	LinearSecondsPerToken     float64 // per token computed
	AttentionSecondsPerPair   float64 // per pair among the tokens computed
	PrefixSecondsPerPair      float64 // per pair with a present token
	PrefixReadSecondsPerToken float64 // per token present; 0 under the presets
	FloorSeconds              float64 // Scenario.PassFloor
	LoadSlowdown              float64 // PrefillFit.LoadSlowdown; 0 under the presets
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

// MarginalSeconds is the work n tokens after p present add to a pass.
func (c *PrefillCost) MarginalSeconds(tokens, prefix int) float64 {
	if tokens <= 0 {
		return 0
	}
	n, p := float64(tokens), float64(prefix)
	return n*c.LinearSecondsPerToken + n*(n+1)/2*c.AttentionSecondsPerPair + n*p*c.PrefixSecondsPerPair
}

// BlockSeconds is what tokens add to a pass after computedBefore computed
// and presentBefore present tokens (it sums to MarginalSeconds).
func (c *PrefillCost) BlockSeconds(tokens, computedBefore, presentBefore int) float64 {
	if tokens <= 0 {
		return 0
	}
	n := float64(tokens)
	return n*c.LinearSecondsPerToken + (n*(n+1)/2+n*float64(max(0, computedBefore)))*c.AttentionSecondsPerPair +
		n*float64(max(0, presentBefore))*c.PrefixSecondsPerPair
}

// PassEndSeconds is the pass cost and the read of present tokens.
func (c *PrefillCost) PassEndSeconds(present int) float64 {
	return c.PassSeconds + float64(max(0, present))*c.PrefixReadSecondsPerToken
}

// Seconds is a whole prefill of n tokens after p present, floor included.
func (c *PrefillCost) Seconds(tokens, prefix int) float64 {
	return max(c.FloorSeconds, c.PassEndSeconds(prefix)+c.MarginalSeconds(tokens, prefix))
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
