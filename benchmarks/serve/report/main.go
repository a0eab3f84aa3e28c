// Report turns one run of benchmarks/serve/run.sh (bench-serve's JSON
// report per strategy, measured against the server on the GPU) and kvtier
// replay's JSON prediction of the same trace and configuration into
// serve-<machine>.{json,md} (benchmarks/results/): TTFT p50 and p90 per
// strategy, measured and predicted side by side, the cost strategy's
// against gpu-only and none from the same run.
//
//	go run ./benchmarks/serve/report -run DIR -replay replay.json -replay calibrated=replay-cal.json -results benchmarks/results
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"kvtier.dev/internal/benchserve"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/replay"
)

// replayReport is the part of kvtier replay --json that is read here.
type replayReport struct {
	Trace   string `json:"trace"`
	Results []struct {
		Strategy string              `json:"strategy"`
		TTFT     results.Percentiles `json:"ttft"`
		HitRatio map[string]float64  `json:"hit_ratio"`
	} `json:"results"`
}

func main() {
	log.SetFlags(0)
	runDir := flag.String("run", "", "run.sh's output directory (bench-<strategy>.json)")
	var replays multi
	flag.Var(&replays, "replay", "kvtier replay --json output for the same trace and configuration, as FILE or LABEL=FILE (the label names its rows, e.g. the calibration it ran with); repeatable")
	resultsDir := flag.String("results", "", "write serve-<machine>.{json,md} here (empty: print the markdown)")
	machine := flag.String("machine", "h200", "machine name")
	command := flag.String("command", "", "the command that produced the run, recorded in the results")
	commit := flag.String("commit", "", "commit the binaries were built from")
	var notes multi
	flag.Var(&notes, "note", "a note to record (repeatable)")
	requestsOut := flag.String("replay-requests", "", "kvtier replay --requests-out FILE of the same trace (the run's bench-serve JSON with --per-request): record, per strategy, the median of measured less predicted TTFT per request, and for cost over the short prefills the replay did not queue")
	against := flag.String("decisions", "", "LABEL of a second cost run in -run (bench-LABEL.json, run with --per-request, e.g. from another prior): record both runs' decisions per window of 20 requests")
	handlingOf := flag.String("handling", "", "LABELs, comma separated, of runs whose bench-LABEL.json has per-request records with the server's timing (examples/server sends it): record each run's handling, its TTFT less the server's queue and forward passes, fitted as a time per request and one per prompt token (kvtier replay --handling-time, --handling-token-time)")
	flag.Parse()
	if *handlingOf != "" {
		for _, label := range strings.Split(*handlingOf, ",") {
			line, err := handling(*runDir, label)
			if err != nil {
				log.Fatalf("report: -handling: %v", err)
			}
			notes = append(notes, line)
		}
	}
	if *requestsOut != "" {
		lines, err := perRequest(*runDir, *requestsOut, shortPrefill)
		if err != nil {
			log.Fatalf("report: -replay-requests: %v", err)
		}
		notes = append(notes, lines...)
	}
	if *against != "" {
		lines, err := decisions(*runDir, *against, 20)
		if err != nil {
			log.Fatalf("report: -decisions: %v", err)
		}
		notes = append(notes, lines...)
	}
	if err := run(*runDir, replays, *resultsDir, *machine, *command, *commit, notes); err != nil {
		log.Fatalf("report: %v", err)
	}
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, "; ") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

var strategies = []string{"cost", "gpu-only", "none"}

// prediction is one replay's report and the label of its rows.
type prediction struct {
	label string
	replayReport
}

// readReplay reads a -replay argument, FILE or LABEL=FILE.
func readReplay(arg string) (prediction, error) {
	p := prediction{label: "kvtier replay"}
	path := arg
	if label, file, ok := strings.Cut(arg, "="); ok {
		if label == "" || file == "" {
			return p, fmt.Errorf("-replay %q: want FILE or LABEL=FILE", arg)
		}
		p.label, path = "kvtier replay, "+label, file
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return p, fmt.Errorf("-replay: %w", err)
	}
	if err := json.Unmarshal(b, &p.replayReport); err != nil {
		return p, fmt.Errorf("-replay %s: %w", path, err)
	}
	return p, nil
}

func run(runDir string, replays []string, resultsDir, machine, command, commit string, notes []string) error {
	if runDir == "" {
		return fmt.Errorf("-run is required")
	}
	measured := map[string]*benchserve.Report{}
	for _, s := range strategies {
		r, err := benchserve.ReadRun(runDir, s, false)
		if err != nil {
			return err
		}
		measured[s] = r
	}
	var preds []prediction
	for _, arg := range replays {
		p, err := readReplay(arg)
		if err != nil {
			return err
		}
		preds = append(preds, p)
	}
	f := results.New("serve", machine, commit)
	if command != "" {
		f.Command = command
	}
	f.Notes = append(f.Notes, notes...)
	name := func(s, p, what string) string { return fmt.Sprintf("TTFT %s %s (%s)", p, s, what) }
	for _, p := range []string{"p50", "p90"} {
		for _, s := range []string{"gpu-only", "none", "cost"} {
			r := measured[s]
			v := r.TTFT.P50
			if p == "p90" {
				v = r.TTFT.P90
			}
			base := ""
			if s == "cost" {
				base = name("gpu-only", p, "measured")
			}
			f.Add(name(s, p, "measured"), "s", []float64{v}, base)
		}
	}
	if s := "cost"; true {
		r := measured[s]
		for _, p := range []string{"p50", "p90"} {
			v := r.TTFT.P50
			if p == "p90" {
				v = r.TTFT.P90
			}
			f.Add(name(s, p, "measured, against none"), "s", []float64{v}, name("none", p, "measured"))
		}
	}
	for _, pr := range preds {
		for _, res := range pr.Results {
			if !contains(strategies, res.Strategy) {
				continue
			}
			for _, p := range []string{"p50", "p90"} {
				v := res.TTFT.P50
				if p == "p90" {
					v = res.TTFT.P90
				}
				f.Add(name(res.Strategy, p, "predicted by "+pr.label), "s", []float64{v}, name(res.Strategy, p, "measured"))
				f.Rows[len(f.Rows)-1].Note = "ratio: measured over predicted"
				f.Rows[len(f.Rows)-1].Ratio = measuredOver(measured[res.Strategy], p, v)
			}
		}
	}
	for _, s := range strategies {
		r := measured[s]
		line := fmt.Sprintf("%s: %d sent, %d completed, errors %v; %.2f req/s; TTFT p50 %.4f s p90 %.4f s p99 %.4f s; inter-token p50 %.4f s; cached %.1f%% of prompt tokens (gpu %d, host %d, nvme %d tokens), %d recomputed",
			s, r.Sent, r.Completed, r.Errors, r.RequestsPerSecond, r.TTFT.P50, r.TTFT.P90, r.TTFT.P99, r.InterToken.P50,
			100*r.Cache.CachedFraction, r.Cache.ByTier.GPU, r.Cache.ByTier.Host, r.Cache.ByTier.NVMe, r.Cache.RecomputedTokens)
		if v := r.Verify; v != nil {
			line += fmt.Sprintf("; --verify %d: %d compared, %d differ (%d near ties within %g nats, %d differences), largest drift of a shared token's logprob %.4f nats, %d reference errors",
				v.Every, v.Compared, v.Mismatches, v.Ties, v.Tolerance, v.Differences, v.MaxDrift, v.Errors)
			line += fmt.Sprintf("; agreement %.4f (%.4f with near ties) over %d reference tokens; the %d that reused %d-%d cached tokens: %.4f (%.4f)",
				v.Agreement, v.AgreementWithTies, v.Tokens, v.Reused, v.CachedMin, v.CachedMax, v.ReusedAgreement, v.ReusedAgreementWithTies)
		}
		f.Notes = append(f.Notes, line)
	}
	for _, pr := range preds {
		for _, res := range pr.Results {
			if contains(strategies, res.Strategy) {
				f.Notes = append(f.Notes, fmt.Sprintf("%s %s: hit ratio gpu %.3f host %.3f nvme %.3f", pr.label, res.Strategy, res.HitRatio["gpu"], res.HitRatio["host"], res.HitRatio["nvme"]))
			}
		}
	}
	if resultsDir == "" {
		return f.Markdown(os.Stdout)
	}
	return f.Write(resultsDir)
}

func measuredOver(r *benchserve.Report, p string, predicted float64) float64 {
	v := r.TTFT.P50
	if p == "p90" {
		v = r.TTFT.P90
	}
	if predicted == 0 {
		return 0
	}
	return v / predicted
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// shortPrefill is the most tokens a prefill computes to count as short in
// perRequest.
const shortPrefill = 400

// perRequest sets each measured request (bench-<strategy>.json's records)
// beside the replay's record of it (kvtier replay --requests-out), and
// returns, per strategy, the median of measured less predicted TTFT; for
// cost also over the requests that computed fewer than short tokens and
// that the replay did not queue (their prefill started within 1 ms of
// their arrival).
func perRequest(runDir, path string, short int) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pred := map[string]map[int64]replay.RequestRecord{}
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r replay.RequestRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
		}
		if pred[r.Strategy] == nil {
			pred[r.Strategy] = map[int64]replay.RequestRecord{}
		}
		pred[r.Strategy][r.Index] = r
	}
	var lines []string
	for _, s := range strategies {
		rep, err := benchserve.ReadRun(runDir, s, true)
		if err != nil {
			return nil, err
		}
		var all, shortOnes []float64
		for _, m := range rep.Requests {
			p, ok := pred[s][int64(m.Index)]
			if !ok || m.Error != "" || m.Cancelled {
				continue
			}
			d := m.TTFTSeconds - p.TTFTSeconds
			all = append(all, d)
			if m.PromptTokens-m.CachedTokens < short && p.StartSeconds-p.ArrivalSeconds < 0.001 {
				shortOnes = append(shortOnes, d)
			}
		}
		if len(all) == 0 {
			return nil, fmt.Errorf("no request of bench-%s.json is in %s", s, path)
		}
		line := fmt.Sprintf("per request, %s: measured less predicted TTFT, median %.1f ms over %d requests", s, 1e3*results.Median(all), len(all))
		if s == "cost" && len(shortOnes) > 0 {
			line += fmt.Sprintf("; %.1f ms over the %d that computed under %d tokens and did not queue in the replay", 1e3*results.Median(shortOnes), len(shortOnes), short)
		}
		lines = append(lines, line)
	}
	return lines, nil
}

// decisions compares the cost run's decisions with those of the cost run
// labelled other, per window of n requests in trace order: blocks loaded
// from the host tier and blocks recomputed (cached but computed), and how
// many requests of the window recomputed the same number of blocks in both
// (within one).
func decisions(runDir, other string, n int) ([]string, error) {
	read := func(label string) ([]benchserve.RequestRecord, error) {
		r, err := benchserve.ReadRun(runDir, label, true)
		if err != nil {
			return nil, err
		}
		return r.Requests, nil
	}
	a, err := read("cost")
	if err != nil {
		return nil, err
	}
	b, err := read(other)
	if err != nil {
		return nil, err
	}
	if len(a) != len(b) {
		return nil, fmt.Errorf("cost has %d requests, %s %d", len(a), other, len(b))
	}
	const bt = 16 // tokens a block: the serve benchmark's
	lines := []string{fmt.Sprintf("decisions per window of %d requests, cost against %s: blocks loaded from the host, blocks recomputed; requests recomputing the same blocks (within one)", n, other)}
	for w := 0; w < len(a); w += n {
		var ah, ar, bh, br, same int
		for i := w; i < min(w+n, len(a)); i++ {
			if a[i].ByTier != nil {
				ah += a[i].ByTier.Host / bt
			}
			if b[i].ByTier != nil {
				bh += b[i].ByTier.Host / bt
			}
			ar, br = ar+a[i].RecomputedTokens/bt, br+b[i].RecomputedTokens/bt
			if d := a[i].RecomputedTokens/bt - b[i].RecomputedTokens/bt; d >= -1 && d <= 1 {
				same++
			}
		}
		lines = append(lines, fmt.Sprintf("requests %d-%d: cost host %d recomputed %d; %s host %d recomputed %d; same %d of %d",
			w, min(w+n, len(a))-1, ah, ar, other, bh, br, same, min(w+n, len(a))-w))
	}
	return lines, nil
}

// handling fits the handling of the run labelled label: per request, its
// TTFT less the server's queue and forward passes (openai.ServerTiming),
// against its prompt tokens, as a + b × tokens by Theil-Sen (the median
// of the pairwise slopes, then of the intercepts), which a few requests
// slowed by something else (a decode round, a garbage collection) cannot
// swing. It returns the note that says so.
func handling(runDir, label string) (string, error) {
	rep, err := benchserve.ReadRun(runDir, label, true)
	if err != nil {
		return "", err
	}
	h, err := benchserve.FitHandling(rep)
	if err != nil {
		return "", fmt.Errorf("bench-%s.json: %w", label, err)
	}
	return fmt.Sprintf("handling, %s: TTFT less the server's queue and forward passes, over %d requests: %.3f ms + %.0f ns per prompt token (median %.2f ms; kvtier replay --handling-time %s --handling-token-time %s)",
		label, h.Requests, 1e3*h.PerRequest.Seconds(), 1e9*h.PerToken.Seconds(), 1e3*h.Median.Seconds(), h.PerRequest.Round(time.Microsecond), h.PerToken), nil
}
