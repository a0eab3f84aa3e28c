package benchserve

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"kvtier.dev/internal/results"
)

// Handling is a served run's time outside the GPU per request: its TTFT
// less the server's queue and forward passes (the server's timing of each
// request), fitted as PerRequest + PerToken × prompt tokens by the
// Theil-Sen line, robust to the few requests a decode round or a garbage
// collection slowed. kvtier replay takes it as --handling-time and
// --handling-token-time.
type Handling struct {
	PerRequest time.Duration
	PerToken   time.Duration
	Median     time.Duration // of the requests' handling
	Requests   int           // with the server's timing, fitted
}

// FitHandling fits r's handling from its per-request records (bench-serve
// --per-request against a server that reports its timing).
func FitHandling(r *Report) (Handling, error) {
	var xs, ys []float64
	for _, q := range r.Requests {
		if st := q.ServerTiming; st != nil && q.Error == "" && !q.Cancelled {
			xs = append(xs, float64(q.PromptTokens))
			ys = append(ys, st.HandlingSeconds(q.TTFTSeconds))
		}
	}
	if len(xs) < 2 {
		return Handling{}, fmt.Errorf("%d requests with the server's timing (bench-serve --per-request against examples/server); a fit needs 2", len(xs))
	}
	a, b := theilSen(xs, ys)
	return Handling{PerRequest: seconds(a), PerToken: seconds(b), Median: seconds(results.Median(ys)), Requests: len(xs)}, nil
}

func seconds(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }

// theilSen returns the intercept and slope of the Theil-Sen line through
// the points (xs[i], ys[i]); the slope is 0 when every x is the same.
func theilSen(xs, ys []float64) (a, b float64) {
	var slopes []float64
	for i := range xs {
		for j := i + 1; j < len(xs); j++ {
			if xs[j] != xs[i] {
				slopes = append(slopes, (ys[j]-ys[i])/(xs[j]-xs[i]))
			}
		}
	}
	if len(slopes) > 0 {
		b = results.Median(slopes)
	}
	res := make([]float64, len(xs))
	for i := range xs {
		res[i] = ys[i] - b*xs[i]
	}
	return results.Median(res), b
}

// ReadRun reads bench-LABEL.json (kvtier bench-serve --json) from a run's
// directory (benchmarks/serve/run.sh); with records, one without
// per-request records (--per-request) is an error.
func ReadRun(dir, label string, records bool) (*Report, error) {
	name := "bench-" + label + ".json"
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if records && len(r.Requests) == 0 {
		return nil, fmt.Errorf("%s has no per-request records (bench-serve --per-request)", name)
	}
	return &r, nil
}
