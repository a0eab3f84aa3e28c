package kvdrift

// Summary is a set of prompts' results together.
type Summary struct {
	Prompts int `json:"prompts"`
	// Agree continuations were equal; of the others, Ties differed first
	// at a near tie and Differences did not.
	Agree       int `json:"agree"`
	Ties        int `json:"ties"`
	Differences int `json:"differences"`
	// Agreement is Agree over Prompts; AgreementWithTies counts the ties
	// as agreeing. Both 0 for no prompts.
	Agreement         float64 `json:"agreement"`
	AgreementWithTies float64 `json:"agreement_with_ties"`
	// Tokens is the continuation tokens compared; CachedMin and CachedMax
	// the prompts' fewest and most cached tokens.
	Tokens    int `json:"tokens"`
	CachedMin int `json:"cached_min"`
	CachedMax int `json:"cached_max"`
	// The largest of each Result field over the prompts.
	Noise        Drift   `json:"noise"`
	Prefill      Drift   `json:"prefill"`
	Continuation Drift   `json:"continuation"`
	LogprobDrift float64 `json:"logprob_drift"`
	// LargestGap is the largest near-tie gap of a differing prompt (nats;
	// 0 when none differed).
	LargestGap float64 `json:"largest_gap"`
}

// Summarize sums up rs.
func Summarize(rs []Result) Summary {
	var s Summary
	for i, r := range rs {
		if i == 0 || r.CachedTokens < s.CachedMin {
			s.CachedMin = r.CachedTokens
		}
		s.CachedMax = max(s.CachedMax, r.CachedTokens)
		s.Prompts++
		s.Tokens += r.Compared
		switch {
		case r.Agree:
			s.Agree++
		case r.Tie:
			s.Ties++
		default:
			s.Differences++
		}
		if !r.Agree {
			s.LargestGap = max(s.LargestGap, r.Gap)
		}
		s.Noise, s.Prefill = s.Noise.Max(r.Noise), s.Prefill.Max(r.Prefill)
		s.Continuation = s.Continuation.Max(r.Continuation)
		s.LogprobDrift = max(s.LogprobDrift, r.LogprobDrift)
	}
	if s.Prompts > 0 {
		s.Agreement = float64(s.Agree) / float64(s.Prompts)
		s.AgreementWithTies = float64(s.Agree+s.Ties) / float64(s.Prompts)
	}
	return s
}
