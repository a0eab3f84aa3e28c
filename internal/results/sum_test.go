package results

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// Seven queue waits of a seventh of time.Duration's range and more sum
// past it: as a time.Duration their mean went negative (-1.3e9 s in a
// replay of seven requests of 10^9 tokens). A DurationSum's is right.
func TestDurationSumDoesNotWrap(t *testing.T) {
	const d = time.Duration(math.MaxInt64/7) + time.Hour
	var s DurationSum
	var wrapped time.Duration
	for range 7 {
		s.Add(d)
		wrapped += d
	}
	if wrapped > 0 {
		t.Fatal("the time.Duration sum did not wrap: the test proves nothing")
	}
	if got, want := s.MeanSeconds(7), d.Seconds(); math.Abs(got-want) > 1e-12*want {
		t.Errorf("mean %v s, want %v s", got, want)
	}
	if got, want := s.Seconds(), 7*d.Seconds(); math.Abs(got-want) > 1e-12*want {
		t.Errorf("sum %v s, want %v s", got, want)
	}
	var two DurationSum
	two.AddSum(s)
	two.AddSum(s)
	if got, want := two.Seconds(), 14*d.Seconds(); math.Abs(got-want) > 1e-12*want {
		t.Errorf("two sums added: %v s, want %v s", got, want)
	}
	var neg DurationSum
	for range 7 {
		neg.Add(-d)
	}
	if got, want := neg.MeanSeconds(7), -d.Seconds(); math.Abs(got-want) > 1e-12*-want {
		t.Errorf("negative mean %v s, want %v s", got, want)
	}
}

// While the sum fits in a time.Duration it reads to the last bit as the
// time.Duration sum did: the replay's means and totals are unchanged.
func TestDurationSumExactWhileItFits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		var s DurationSum
		var want time.Duration
		n := 1 + rng.IntN(50)
		for range n {
			d := time.Duration(rng.Int64N(int64(time.Hour) * 24 * 365))
			s.Add(d)
			want += d
		}
		if s.Seconds() != want.Seconds() || s.MeanSeconds(int64(n)) != (want/time.Duration(n)).Seconds() {
			t.Fatalf("%d durations: sum %v, mean %v; want %v, %v", n, s.Seconds(), s.MeanSeconds(int64(n)), want.Seconds(), (want / time.Duration(n)).Seconds())
		}
		if s.MeanSeconds(0) != want.Seconds() {
			t.Fatalf("mean over 0: %v, want the sum %v", s.MeanSeconds(0), want.Seconds())
		}
	}
}
