// Package kvdrift measures what a lossy round trip of reused KV blocks (a
// lower tier's compressed copy: package codec's FP8) does to a model's
// output. For one prompt whose first blocks are reused (Run), it computes
// the prompt's tail and a greedy continuation twice, over the original
// blocks and over their round trip into other slots, and compares the two:
// the logits' drift at each position both reached with the same tokens,
// and whether the continuations agree. A one-shot prefill of the whole
// prompt gives the noise floor: how far reuse alone moves the logits
// (passes of other shapes round differently on the GPU; 0 on the CPU
// reference).
//
// A first differing token is a near tie, counted apart from a real
// disagreement, by the rule of kvtier bench-serve --verify
// (benchserve.TieGap and NearTie on the two sides' logits).
//
// The model is any backend of package model's forward pass (model.CPU,
// the GPU runtime); the round trip is a Recoder: package codec in Go over
// host or device slots, or package cudacodec's kernels.
package kvdrift

import "math"

// Drift compares two logit vectors of one position: Abs is the largest
// |got - ref| over the vocabulary; OfMax is Abs over the reference's
// largest |logit|, OfStd Abs over the reference's standard deviation
// across the vocabulary (the logits' spread).
type Drift struct {
	Abs   float64 `json:"abs"`
	OfMax float64 `json:"of_max"`
	OfStd float64 `json:"of_std"`
}

// Max is the fieldwise larger of d and o.
func (d Drift) Max(o Drift) Drift {
	return Drift{Abs: max(d.Abs, o.Abs), OfMax: max(d.OfMax, o.OfMax), OfStd: max(d.OfStd, o.OfStd)}
}

// Unbounded stands for a drift that has no finite measure (a NaN logit, a
// difference over a zero spread): the largest float64, so that a broken
// side never looks close and the figure still encodes as JSON.
const Unbounded = math.MaxFloat64

// Compare returns got's drift from ref. They MUST have one length. A NaN
// on either side makes every field Unbounded.
func Compare(ref, got []float32) Drift {
	var diff, big, sum, sum2 float64
	for i, r := range ref {
		x, y := float64(r), float64(got[i])
		d := math.Abs(y - x)
		if math.IsNaN(d) {
			return Drift{Abs: Unbounded, OfMax: Unbounded, OfStd: Unbounded}
		}
		diff = max(diff, d)
		big = max(big, math.Abs(x))
		sum += x
		sum2 += x * x
	}
	n := float64(len(ref))
	std := math.Sqrt(max(0, sum2/n-(sum/n)*(sum/n)))
	return Drift{Abs: diff, OfMax: ratio(diff, big), OfStd: ratio(diff, std)}
}

// ratio is a/b, 0 for a 0 difference and Unbounded over a zero scale.
func ratio(a, b float64) float64 {
	switch {
	case a == 0:
		return 0
	case b == 0:
		return Unbounded
	}
	return a / b
}

// logprob is token t's log-probability under logits: logits[t] less their
// log-sum-exp, in float64. Terms more than 40 below the largest are left
// out of the sum (each is below e^-40 of it).
func logprob(logits []float32, t int32) float64 {
	top := float64(logits[0])
	for _, v := range logits {
		top = max(top, float64(v))
	}
	var sum float64
	for _, v := range logits {
		if d := float64(v) - top; d > -40 {
			sum += math.Exp(d)
		}
	}
	return float64(logits[t]) - top - math.Log(sum)
}
