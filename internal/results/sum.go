package results

import "time"

// DurationSum adds up durations without wrapping: exactly, as a
// time.Duration, while the sum fits in one; past 2^63 ns (292 years, as
// the queue waits of seven requests of 10^9 tokens add up to) it goes on
// in float64 nanoseconds, where a time.Duration sum wrapped negative. Its
// zero value is an empty sum.
type DurationSum struct {
	exact time.Duration // the sum since the last overflow
	spill float64       // what overflowed exact, in nanoseconds
}

// Add adds d.
func (s *DurationSum) Add(d time.Duration) {
	if t := s.exact + d; (d > 0 && t < s.exact) || (d < 0 && t > s.exact) {
		s.spill += float64(s.exact)
		s.exact = d
		return
	}
	s.exact += d
}

// AddSum adds o.
func (s *DurationSum) AddSum(o DurationSum) {
	s.Add(o.exact)
	s.spill += o.spill
}

// Seconds is the sum in seconds: time.Duration's Seconds while it is exact.
func (s DurationSum) Seconds() float64 {
	if s.spill == 0 {
		return s.exact.Seconds()
	}
	return (s.spill + float64(s.exact)) / 1e9
}

// MeanSeconds is the sum over n (taken as 1 below 1), in seconds: while
// the sum is exact, cut to whole nanoseconds as time.Duration's division
// cuts.
func (s DurationSum) MeanSeconds(n int64) float64 {
	n = max(1, n)
	if s.spill == 0 {
		return (s.exact / time.Duration(n)).Seconds()
	}
	return (s.spill + float64(s.exact)) / float64(n) / 1e9
}
