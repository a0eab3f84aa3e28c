package engine

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

func TestTopLogprobs(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, 5000)
	for i := range logits {
		logits[i] = float32(r.NormFloat64() * 3)
	}
	logits[17], logits[4000] = 20, 20 // a tie: the lower id first
	got := topLogprobs(logits, 5, 4000)

	ids := make([]int, len(logits))
	for i := range ids {
		ids[i] = i
	}
	sort.SliceStable(ids, func(a, b int) bool { return logits[ids[a]] > logits[ids[b]] })
	sum := 0.0
	for _, v := range logits {
		sum += math.Exp(float64(v))
	}
	want := func(id int) float64 { return float64(logits[id]) - math.Log(sum) }
	if len(got.Top) != 5 {
		t.Fatalf("%d top tokens, want 5", len(got.Top))
	}
	for i, tt := range got.Top {
		if int(tt.ID) != ids[i] || math.Abs(float64(tt.Logprob)-want(ids[i])) > 1e-4 {
			t.Errorf("top %d: id %d logprob %g, want id %d logprob %g", i, tt.ID, tt.Logprob, ids[i], want(ids[i]))
		}
	}
	if math.Abs(float64(got.Logprob)-want(4000)) > 1e-4 {
		t.Errorf("the token's logprob %g, want %g", got.Logprob, want(4000))
	}
	if none := topLogprobs(logits, 0, 3); len(none.Top) != 0 || math.Abs(float64(none.Logprob)-want(3)) > 1e-4 {
		t.Errorf("k = 0: %+v; want the token's alone", none)
	}
}
