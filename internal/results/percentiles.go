package results

import "time"

// Percentiles of a time, in seconds. kvtier replay's predictions and
// bench-serve's measurements both report their times so, to be read side
// by side.
type Percentiles struct {
	P50  float64 `json:"p50_s"`
	P90  float64 `json:"p90_s"`
	P99  float64 `json:"p99_s"`
	Mean float64 `json:"mean_s"`
	Max  float64 `json:"max_s"`
}

// PercentilesOf returns the nearest-rank percentiles of sorted, their mean
// and the largest; all zero for none. sorted MUST be in ascending order.
func PercentilesOf(sorted []time.Duration) Percentiles {
	if len(sorted) == 0 {
		return Percentiles{}
	}
	return Percentiles{P50: Quantile(sorted, 0.50), P90: Quantile(sorted, 0.90), P99: Quantile(sorted, 0.99),
		Mean: meanSeconds(sorted), Max: sorted[len(sorted)-1].Seconds()}
}

// Quantile returns the nearest-rank p-quantile (p from 0 to 1) of sorted,
// in seconds. sorted MUST be in ascending order and not empty.
func Quantile(sorted []time.Duration, p float64) float64 {
	i := int(p*float64(len(sorted))+0.999999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))].Seconds()
}

// meanSeconds returns the mean of sorted (ascending, not empty) in
// seconds. The sum is a float64 of nanoseconds, where a time.Duration sum
// wrapped negative past 292 years. It is exact below 2^53 ns (104 days),
// and there the mean, cut to whole nanoseconds as time.Duration's division
// cut it, reads as it did to the last bit.
func meanSeconds(sorted []time.Duration) float64 {
	var sum float64
	for _, d := range sorted {
		sum += float64(d)
	}
	mean, largest := sum/float64(len(sorted)), sorted[len(sorted)-1]
	if mean >= float64(largest) {
		// Rounding only; and 2^63, the float64 of math.MaxInt64, does
		// not convert back to a time.Duration.
		return largest.Seconds()
	}
	return time.Duration(mean).Seconds()
}
