package cost

import (
	"fmt"
	"strings"
)

// DefaultErrorBudget is the relative RMS error (Codec.ErrorRMS) a tier's
// codec may add to the KV when the caller sets no budget: FP8 e4m3 with a
// scale per head (0.027) is within it, a 4-bit format (about 0.1) is not.
const DefaultErrorBudget = 0.05

// chooseLoadBlocks is the load ChooseCodec prices with and without a
// codec: a long prefix's, where the steady rate matters and the fixed
// costs (latency, the last chunk's decode) are amortised.
const chooseLoadBlocks = 64

// CodecChoice is ChooseCodec's answer: the codec (the zero Codec: none)
// and why, for a person.
type CodecChoice struct {
	Codec  Codec
	Reason string
}

// ChooseCodec says how a tier whose loads cross p should hold blocks of
// blockTokens tokens of m on one of tp GPUs: with the candidate (the
// presets, if none is given) that adds no more error than budget
// (Codec.ErrorRMS) and whose loads are no slower than the raw blocks'
// (64 blocks priced as the Planner prices a compressed load: the slower of
// the encoded copy and the decode, then the last chunk's decode), the one
// with the smallest blocks if several; none when none qualifies. Such a
// codec pays twice: the tier holds more blocks in the same bytes, and
// loads them sooner. What it does not weigh: the encode's GPU time on
// offloads (about 1/230 of a block's recompute for llama-3.1-8b on the
// H200). p's own Codec is ignored. Errors name what was wrong: a budget
// outside [0, 1), a path, model or candidate that does not validate.
func ChooseCodec(p Path, m Model, blockTokens, tp int, budget float64, candidates ...Codec) (CodecChoice, error) {
	if !(budget >= 0 && budget < 1) {
		return CodecChoice{}, fieldErr("error_budget", budget, "must be at least 0 and below 1")
	}
	if err := m.Validate(); err != nil {
		return CodecChoice{}, err
	}
	if err := checkTokens("block_tokens", blockTokens, 1); err != nil {
		return CodecChoice{}, err
	}
	p.Codec = Codec{}
	if err := p.Validate(); err != nil {
		return CodecChoice{}, err
	}
	if len(candidates) == 0 {
		for _, n := range CodecNames() {
			candidates = append(candidates, codecPresets[n])
		}
	}
	raw := m.KVBytesPerTokenPerRank(tp) * int64(blockTokens)
	rawS := p.codecLoadSeconds(chooseLoadBlocks*raw, 0, 0)
	var choice CodecChoice
	var rejected []string
	for _, c := range candidates {
		if err := c.Validate(); err != nil {
			return CodecChoice{}, err
		}
		if !c.Enabled() {
			continue
		}
		if err := c.checkModel(&m); err != nil {
			rejected = append(rejected, fmt.Sprintf("%s: %v", c.Name, err))
			continue
		}
		if c.ErrorRMS > budget {
			rejected = append(rejected, fmt.Sprintf("%s: its error %.3g is over the budget %.3g", c.Name, c.ErrorRMS, budget))
			continue
		}
		q := p
		q.Codec = c
		enc := c.EncodedBlockBytes(&m, blockTokens, tp)
		s := q.codecLoadSeconds(chooseLoadBlocks*raw, chooseLoadBlocks*enc, int64(c.ChunkBlocks)*raw)
		if s > rawS {
			rejected = append(rejected, fmt.Sprintf("%s: %d blocks over %s load in %.3g ms, raw in %.3g ms", c.Name, chooseLoadBlocks, p.Name(), s*1e3, rawS*1e3))
			continue
		}
		if choice.Codec.Enabled() && choice.Codec.EncodedBlockBytes(&m, blockTokens, tp) <= enc {
			continue
		}
		choice = CodecChoice{Codec: c, Reason: fmt.Sprintf("%s: %.2fx the blocks in the same bytes; %d blocks over %s load in %.3g ms, raw in %.3g ms; error %.3g within the budget %.3g",
			c.Name, float64(raw)/float64(enc), chooseLoadBlocks, p.Name(), s*1e3, rawS*1e3, c.ErrorRMS, budget)}
	}
	if !choice.Codec.Enabled() {
		choice.Reason = "none: no codec to choose from"
		if len(rejected) > 0 {
			choice.Reason = "none: " + strings.Join(rejected, "; ")
		}
	}
	return choice, nil
}
