package benchserve

import (
	"math/rand/v2"

	"kvtier.dev/kvtier/trace"
)

// promptMaker turns a trace request into the token ids it sends. Block i
// becomes a run of ids drawn from a generator seeded by (key i, salt ^
// seed), so two requests with the same salt and key i send the same ids in
// block i: the trace's shared prefixes are shared prompts.
type promptMaker struct {
	vocab uint32
	seed  uint64
	// blockTokens, when above 0, is the length a full block becomes; a
	// partial last block shrinks in proportion (rounded up).
	blockTokens int
	// maxTokens, when above 0, cuts prompts to that many tokens.
	maxTokens int
}

// make returns the prompt of req, and whether it was cut to maxTokens.
func (p *promptMaker) make(req *trace.Request) ([]int32, bool) {
	var toks []int32
	if len(req.Tokens) > 0 {
		toks = append([]int32(nil), req.Tokens...)
	} else {
		var pcg rand.PCG
		for i, key := range req.Keys {
			n := min(req.BlockTokens, req.InputTokens-i*req.BlockTokens)
			if p.blockTokens > 0 {
				n = (n*p.blockTokens + req.BlockTokens - 1) / req.BlockTokens
			}
			pcg.Seed(key, req.Salt^p.seed)
			for range n {
				toks = append(toks, int32(uint32(pcg.Uint64()>>32)%p.vocab))
			}
			if p.maxTokens > 0 && len(toks) >= p.maxTokens {
				break
			}
		}
	}
	if p.maxTokens > 0 && len(toks) > p.maxTokens {
		return toks[:p.maxTokens], true
	}
	return toks, false
}
