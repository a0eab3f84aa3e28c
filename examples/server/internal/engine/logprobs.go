package engine

import (
	"math"

	"kvtier.dev/examples/server/internal/httpapi"
)

// topLogprobs returns tok's log-probability under the softmax of logits and
// the k most likely tokens (ties to the lower id), most likely first. The
// log-sum-exp is taken in float64 over every logit, so that two answers'
// log-probabilities differ only as much as their logits do.
func topLogprobs(logits []float32, k int, tok int32) httpapi.TokenLogprobs {
	if len(logits) == 0 {
		return httpapi.TokenLogprobs{Logprob: float32(math.NaN())}
	}
	hi := logits[0]
	for _, v := range logits {
		hi = max(hi, v)
	}
	sum := 0.0
	for _, v := range logits {
		sum += math.Exp(float64(v - hi))
	}
	lse := float64(hi) + math.Log(sum)
	lp := func(id int32) float32 { return float32(float64(logits[id]) - lse) }
	out := httpapi.TokenLogprobs{Logprob: float32(math.NaN())}
	if tok >= 0 && int(tok) < len(logits) {
		out.Logprob = lp(tok)
	}
	k = min(k, len(logits))
	if k <= 0 {
		return out
	}
	// Insertion into the k best seen so far: k is at most 20, the logits
	// tens of thousands, and most of them never beat the k-th.
	top := make([]int32, 0, k)
	better := func(a, b int32) bool { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b) }
	for i := range logits {
		id := int32(i)
		if len(top) == k && !better(id, top[k-1]) {
			continue
		}
		if len(top) < k {
			top = append(top, id)
		} else {
			top[k-1] = id
		}
		for j := len(top) - 1; j > 0 && better(top[j], top[j-1]); j-- {
			top[j], top[j-1] = top[j-1], top[j]
		}
	}
	out.Top = make([]httpapi.TopToken, len(top))
	for i, id := range top {
		out.Top[i] = httpapi.TopToken{ID: id, Logprob: lp(id)}
	}
	return out
}
