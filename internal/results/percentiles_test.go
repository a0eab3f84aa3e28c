package results

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestPercentilesNearestRank(t *testing.T) {
	ds := make([]time.Duration, 100)
	for i := range ds {
		ds[i] = time.Duration(i+1) * time.Millisecond
	}
	want := Percentiles{P50: 0.050, P90: 0.090, P99: 0.099, Mean: 0.0505, Max: 0.100}
	if got := PercentilesOf(ds); got != want {
		t.Errorf("1 to 100 ms: %+v, want %+v", got, want)
	}
	if got := PercentilesOf(ds[:1]); got != (Percentiles{P50: 0.001, P90: 0.001, P99: 0.001, Mean: 0.001, Max: 0.001}) {
		t.Errorf("one sample: %+v", got)
	}
	if got := PercentilesOf(nil); got != (Percentiles{}) {
		t.Errorf("none: %+v, want zeros", got)
	}
	if q0, q100 := Quantile(ds, 0), Quantile(ds, 1); q0 != 0.001 || q100 != 0.100 {
		t.Errorf("Quantile 0 and 1: %v and %v, want the smallest and the largest", q0, q100)
	}
}

// TestPercentilesMeanDoesNotOverflow: seven times of a quarter of
// time.Duration's range each sum past it. Summed as a time.Duration they
// wrapped and the mean went negative, as seven requests of 10^9 tokens
// once made a mean TTFT of -868,076,497 s.
func TestPercentilesMeanDoesNotOverflow(t *testing.T) {
	const quarter = time.Duration(math.MaxInt64 / 4)
	ds := []time.Duration{quarter - 6, quarter - 5, quarter - 4, quarter - 3, quarter - 2, quarter - 1, quarter}
	p := PercentilesOf(ds)
	want := (quarter - 3).Seconds()
	if math.Abs(p.Mean-want) > 1e-9*want {
		t.Errorf("mean of 7 times of %v: %v s, want %v s", quarter, p.Mean, want)
	}
	if p.Mean > p.Max || p.Mean < ds[0].Seconds() {
		t.Errorf("mean %v s outside the samples' range [%v, %v]", p.Mean, ds[0].Seconds(), p.Max)
	}
	// At the very top of the range the mean's float64 is 2^63, one past
	// what a time.Duration holds: it reads as the largest.
	top := []time.Duration{math.MaxInt64, math.MaxInt64, math.MaxInt64}
	if got, want := PercentilesOf(top).Mean, time.Duration(math.MaxInt64).Seconds(); got != want {
		t.Errorf("mean of 3 times of math.MaxInt64: %v s, want %v s", got, want)
	}
}

// TestPercentilesMeanAsBeforeBelow104Days: where the sum is below 2^53 ns
// (104 days), the mean is what time.Duration's division gave, to the last
// bit, so that reports of ordinary runs read as they did.
func TestPercentilesMeanAsBeforeBelow104Days(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		ds := make([]time.Duration, 1+r.IntN(3000))
		var sum time.Duration
		for i := range ds {
			ds[i] = time.Duration(r.Int64N(int64(10 * time.Second)))
			sum += ds[i]
		}
		slices.Sort(ds)
		if got, want := PercentilesOf(ds).Mean, (sum / time.Duration(len(ds))).Seconds(); got != want {
			t.Fatalf("mean of %d times: %v s, time.Duration's division %v s", len(ds), got, want)
		}
	}
}
