package cost

import "time"

// PrefillCost prices the prefills of one model on tp GPUs of one kind: a
// cost every pass pays whatever it computes, plus marginal costs that grow
// with the tokens computed (the linear layers) and with the query-key pairs
// they attend (attention: pairs among the tokens computed, and pairs with
// the tokens present before them, each at its own rate). Build it with (*Fit).PrefillCost, or
// PresetPrefillCost for the presets alone. It is a small value: copy it.
//
//	prefill(n tokens after p present) = max(Floor, Pass + n·PerToken + n(n+1)/2·PerPair + n·p·PerPrefixPair)
//
// Two attention rates, because runtimes run the two kinds of pairs
// differently: a prefill from scratch is one square causal attention,
// while one on top of a cached prefix attends a longer key range than its
// queries under a shifted mask, often through another kernel. Under
// PyTorch SDPA on the H200, pairs with a 32,768-token prefix ran at about
// half the rate of pairs within a prefill from scratch; under the presets
// the two rates are equal.
//
// Recomputing cached tokens adds only the marginal cost to a pass the
// request runs anyway, so the Planner charges blocks their marginal cost
// and each plan its Pass once.
type PrefillCost struct {
	// PassSeconds is paid once per prefill: the fit's fixed cost plus its
	// weight term (the ramp of a pass's efficiency with its tokens). 0 under
	// the presets.
	PassSeconds float64
	// LinearSecondsPerToken is the linear layers' time per token computed.
	LinearSecondsPerToken float64
	// AttentionSecondsPerPair is attention's time per query-key pair
	// among the tokens computed.
	AttentionSecondsPerPair float64
	// PrefixSecondsPerPair is attention's time per pair of a token
	// computed with a token present before it.
	PrefixSecondsPerPair float64
	// PrefixReadSecondsPerToken is paid once per prefill for each token
	// present before it: the pass going through the prefix's KV. It is
	// the same whatever a plan loads or recomputes, so MarginalSeconds
	// leaves it out (and with it the Planner and the replay, whose
	// decisions it cannot move); Seconds has it. 0 under the presets.
	PrefixReadSecondsPerToken float64
	// FloorSeconds is the shortest pass: the weights (per rank) over the
	// GPU's HBM bandwidth (Scenario.PassFloor).
	FloorSeconds float64
}

// PresetPrefillCost is the presets' prefill cost: FLOPs over the GPU's
// effective rate (peak × efficiency × tp), no pass cost, and the HBM floor.
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

// MarginalSeconds is the work n tokens after p present ones add to a pass:
// linear and attention, no pass cost, no floor.
func (c *PrefillCost) MarginalSeconds(tokens, prefix int) float64 {
	if tokens <= 0 {
		return 0
	}
	n, p := float64(tokens), float64(prefix)
	return n*c.LinearSecondsPerToken + n*(n+1)/2*c.AttentionSecondsPerPair + n*p*c.PrefixSecondsPerPair
}

// BlockSeconds is the work a block of tokens adds to a pass in which
// computedBefore tokens before it are computed too and presentBefore are
// present (on the GPU, or loaded): its linear work, its pairs among
// themselves and with the tokens computed before it at the attention rate
// (they are all among the pass's new tokens), and its pairs with the
// present ones at the prefix rate. Summed over the blocks of n tokens after
// p present ones it is MarginalSeconds(n, p) exactly; over a plan with
// holes or a recomputed head, it prices each pair as Seconds's terms mean
// it, where MarginalSeconds(tokens, position) would price every pair with
// an earlier block at the prefix rate.
func (c *PrefillCost) BlockSeconds(tokens, computedBefore, presentBefore int) float64 {
	if tokens <= 0 {
		return 0
	}
	n := float64(tokens)
	return n*c.LinearSecondsPerToken + (n*(n+1)/2+n*float64(max(0, computedBefore)))*c.AttentionSecondsPerPair +
		n*float64(max(0, presentBefore))*c.PrefixSecondsPerPair
}

// PassEndSeconds is what a pass pays once beside its blocks' work
// (BlockSeconds) when present tokens are present: the pass cost and the
// read of the present tokens' KV.
func (c *PrefillCost) PassEndSeconds(present int) float64 {
	return c.PassSeconds + float64(max(0, present))*c.PrefixReadSecondsPerToken
}

// Seconds is a whole prefill of n tokens after p present ones: the pass
// cost plus the marginal work, no less than the floor.
func (c *PrefillCost) Seconds(tokens, prefix int) float64 {
	return max(c.FloorSeconds, c.PassEndSeconds(prefix)+c.MarginalSeconds(tokens, prefix))
}

// Time is Seconds as a Duration.
func (c *PrefillCost) Time(tokens, prefix int) time.Duration {
	return seconds(c.Seconds(tokens, prefix))
}

// MarginalTime is MarginalSeconds as a Duration.
func (c *PrefillCost) MarginalTime(tokens, prefix int) time.Duration {
	return seconds(c.MarginalSeconds(tokens, prefix))
}
