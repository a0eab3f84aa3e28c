package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvtier.dev/internal/benchserve"
	"kvtier.dev/internal/openai"
	"kvtier.dev/internal/results"
)

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestReport: one run's three strategies and two labelled replays become
// rows, measured against the baselines and predicted against measured.
func TestReport(t *testing.T) {
	dir := t.TempDir()
	runDir := filepath.Join(dir, "run")
	if err := os.Mkdir(runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for s, p50 := range map[string]float64{"cost": 0.05, "gpu-only": 0.2, "none": 0.4} {
		var r benchserve.Report
		r.TTFT.P50, r.TTFT.P90 = p50, 2*p50
		if s == "cost" {
			r.Verify = &benchserve.VerifyReport{Every: 2, Compared: 4, Tokens: 128, Agreement: 0.75, AgreementWithTies: 1,
				Reused: 2, CachedMin: 2048, CachedMax: 4096, ReusedAgreement: 0.5, ReusedAgreementWithTies: 1}
		}
		writeJSON(t, filepath.Join(runDir, "bench-"+s+".json"), &r)
	}
	pred := func(cost float64) string {
		path := filepath.Join(dir, "replay.json")
		writeJSON(t, path, map[string]any{"results": []map[string]any{
			{"strategy": "cost", "ttft": map[string]float64{"p50_s": cost, "p90_s": 2 * cost}},
			{"strategy": "reload", "ttft": map[string]float64{"p50_s": 9, "p90_s": 9}},
		}})
		return path
	}
	out := filepath.Join(dir, "results")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := run(runDir, []string{pred(0.1), "calibrated=" + pred(0.1)}, out, "test", "a command", "abc", []string{"a note"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "serve-test.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f results.File
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	rows := map[string]results.Row{}
	for _, r := range f.Rows {
		rows[r.Name] = r
	}
	if r := rows["TTFT p50 cost (measured)"]; r.Median != 0.05 || r.Ratio != 4 {
		t.Errorf("cost p50 row %+v: want 0.05 s, 4x gpu-only's", r)
	}
	for _, label := range []string{"kvtier replay", "kvtier replay, calibrated"} {
		r, ok := rows["TTFT p50 cost (predicted by "+label+")"]
		if !ok || r.Median != 0.1 || r.Ratio != 0.5 {
			t.Errorf("%s's cost p50 row %+v (present %v): want 0.1 s, measured/predicted 0.5", label, r, ok)
		}
	}
	for name := range rows {
		if strings.Contains(name, "reload") {
			t.Errorf("row %q: reload was not measured", name)
		}
	}
	if want := "agreement 0.7500 (1.0000 with near ties) over 128 reference tokens; the 2 that reused 2048-4096 cached tokens: 0.5000 (1.0000)"; !strings.Contains(strings.Join(f.Notes, "\n"), want) {
		t.Errorf("no note on --verify's agreement %q in %q", want, f.Notes)
	}
	if f.Command != "a command" || f.Commit != "abc" || !strings.Contains(strings.Join(f.Notes, "\n"), "a note") {
		t.Errorf("command %q, commit %q, notes %q", f.Command, f.Commit, f.Notes)
	}
}

func TestReportErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ arg, want string }{
		{"=x.json", "want FILE or LABEL=FILE"},
		{"label=", "want FILE or LABEL=FILE"},
		{filepath.Join(dir, "absent.json"), "absent.json"},
		{bad, "bad.json"},
	} {
		if _, err := readReplay(tc.arg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("-replay %s: %v; want an error with %q", tc.arg, err, tc.want)
		}
	}
	if err := run("", nil, "", "m", "", "", nil); err == nil || !strings.Contains(err.Error(), "-run") {
		t.Errorf("no -run: %v", err)
	}
	if err := run(dir, nil, "", "m", "", "", nil); err == nil || !strings.Contains(err.Error(), "bench-cost.json") {
		t.Errorf("a run directory without bench-cost.json: %v", err)
	}
}

// TestDecisions: two cost runs' per-request records become per-window
// counts of host loads and recomputes; a run without records, or of
// another length, is refused.
func TestDecisions(t *testing.T) {
	dir := t.TempDir()
	rec := func(host, recomputed int) benchserve.RequestRecord {
		return benchserve.RequestRecord{ByTier: &openai.TierTokens{Host: host * 16}, RecomputedTokens: recomputed * 16}
	}
	a := benchserve.Report{Requests: []benchserve.RequestRecord{rec(10, 1), rec(20, 2), rec(5, 0)}}
	b := benchserve.Report{Requests: []benchserve.RequestRecord{rec(8, 3), rec(20, 2), rec(5, 1)}}
	writeJSON(t, filepath.Join(dir, "bench-cost.json"), &a)
	writeJSON(t, filepath.Join(dir, "bench-other.json"), &b)
	lines, err := decisions(dir, "other", 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"requests 0-1: cost host 30 recomputed 3; other host 28 recomputed 5; same 1 of 2",
		"requests 2-2: cost host 5 recomputed 0; other host 5 recomputed 1; same 1 of 1"}
	if len(lines) != 3 || lines[1] != want[0] || lines[2] != want[1] {
		t.Fatalf("%q\nwant %q", lines, want)
	}
	writeJSON(t, filepath.Join(dir, "bench-bare.json"), &benchserve.Report{})
	if _, err := decisions(dir, "bare", 2); err == nil || !strings.Contains(err.Error(), "--per-request") {
		t.Errorf("a run without records: %v", err)
	}
	writeJSON(t, filepath.Join(dir, "bench-short.json"), &benchserve.Report{Requests: a.Requests[:1]})
	if _, err := decisions(dir, "short", 2); err == nil || !strings.Contains(err.Error(), "3 requests, short 1") {
		t.Errorf("runs of other lengths: %v", err)
	}
}

// TestPerRequest: measured and predicted records meet by index; the
// median difference is per strategy, and cost's short, unqueued prefills
// have theirs; a run without records and a malformed line are refused.
func TestPerRequest(t *testing.T) {
	dir := t.TempDir()
	meas := func(ttft ...float64) *benchserve.Report {
		r := &benchserve.Report{}
		for i, v := range ttft {
			r.Requests = append(r.Requests, benchserve.RequestRecord{Index: i, TTFTSeconds: v, PromptTokens: 1000, CachedTokens: 100 * i})
		}
		return r
	}
	writeJSON(t, filepath.Join(dir, "bench-cost.json"), meas(0.030, 0.040, 0.050))
	writeJSON(t, filepath.Join(dir, "bench-gpu-only.json"), meas(0.2, 0.3, 0.4))
	writeJSON(t, filepath.Join(dir, "bench-none.json"), meas(0.5, 0.5, 0.5))
	var lines []string
	for _, s := range strategies {
		for i := range 3 {
			start := 0.0
			if i == 0 {
				start = 0.5 // queued
			}
			b, _ := json.Marshal(map[string]any{"strategy": s, "index": i, "arrival_s": 0, "start_s": start, "ttft_s": 0.010 * float64(i+1)})
			lines = append(lines, string(b))
		}
	}
	path := filepath.Join(dir, "requests.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// cost: differences 20, 20, 20 ms; short (under 900 computed: 1000 -
	// 100i < 900 for i >= 2) and unqueued: request 2 alone.
	got, err := perRequest(dir, path, 900)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"per request, cost: measured less predicted TTFT, median 20.0 ms over 3 requests; 20.0 ms over the 1 that computed under 900 tokens and did not queue in the replay",
		"per request, gpu-only: measured less predicted TTFT, median 280.0 ms over 3 requests",
		"per request, none: measured less predicted TTFT, median 480.0 ms over 3 requests"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%q\nwant %q", got, want)
	}
	if err := os.WriteFile(path, []byte("{\"strategy\": 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := perRequest(dir, path, 900); err == nil || !strings.Contains(err.Error(), "requests.jsonl:1") {
		t.Errorf("a malformed line: %v", err)
	}
	writeJSON(t, filepath.Join(dir, "bench-none.json"), &benchserve.Report{})
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := perRequest(dir, path, 900); err == nil || !strings.Contains(err.Error(), "--per-request") {
		t.Errorf("a run without records: %v", err)
	}
}

// TestHandling: requests whose handling is 2 ms + 500 ns per prompt token,
// and two slowed by 50 ms (a decode round they waited for), fit to the
// line; a run without the server's timing is an error.
func TestHandling(t *testing.T) {
	dir := t.TempDir()
	r := &benchserve.Report{}
	for i := range 20 {
		tokens := 1000 + 400*i
		h := 0.002 + 500e-9*float64(tokens)
		if i == 3 || i == 11 {
			h += 0.050
		}
		st := &openai.ServerTiming{QueueSeconds: 0.001 * float64(i%3), PrefillSeconds: 0.03, ForwardSeconds: 0.025}
		r.Requests = append(r.Requests, benchserve.RequestRecord{Index: i, PromptTokens: tokens,
			TTFTSeconds: h + st.QueueSeconds + st.ForwardSeconds, ServerTiming: st})
	}
	r.Requests = append(r.Requests, benchserve.RequestRecord{Index: 20, PromptTokens: 9000, TTFTSeconds: 9}) // no timing: skipped
	writeJSON(t, filepath.Join(dir, "bench-cost.json"), r)
	got, err := handling(dir, "cost")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, "over 20 requests: 2.000 ms + 500 ns per prompt token") || !strings.Contains(got, "--handling-time 2ms --handling-token-time 500ns") {
		t.Errorf("%s", got)
	}
	writeJSON(t, filepath.Join(dir, "bench-none.json"), &benchserve.Report{Requests: []benchserve.RequestRecord{{TTFTSeconds: 1}}})
	if _, err := handling(dir, "none"); err == nil || !strings.Contains(err.Error(), "0 requests with the server's timing") {
		t.Errorf("a run without the server's timing: %v", err)
	}
	if _, err := handling(dir, "absent"); err == nil {
		t.Error("a missing run accepted")
	}
}
