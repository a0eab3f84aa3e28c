package replay

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"kvtier.dev/kvtier/costplan"
)

// collect replays src under cfg and returns the report and the records.
func collect(t *testing.T, src Source, cfg Config) (*Report, []RequestRecord) {
	t.Helper()
	var recs []RequestRecord
	rep, err := Run(src, cfg, Options{OnRequest: func(r RequestRecord) error {
		recs = append(recs, r)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	return rep, recs
}

func ns(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }

// replayLines replays src under cfg and returns the report's JSON and the
// request records' lines.
func replayLines(t *testing.T, src Source, cfg Config) (report, lines []byte) {
	t.Helper()
	var rb, lb bytes.Buffer
	rep, err := Run(src, cfg, Options{OnRequest: RequestLines(&lb)})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteJSON(&rb); err != nil {
		t.Fatal(err)
	}
	return rb.Bytes(), lb.Bytes()
}

// TestRequestRecordsDeterministic: on each configuration, two replays give
// byte-identical reports and request lines;
// the lines hold one record per request and strategy, agree with the
// report, and no prefill starts before the one before it has ended (one
// prefill slot).
func TestRequestRecordsDeterministic(t *testing.T) {
	const n = 400
	src := firstLines(BundledSource(), n)
	for _, c := range []struct {
		name string
		edit func(*Config)
	}{
		{"default", func(*Config) {}},
		{"write-back", func(c *Config) { c.WriteThrough = false }},
		{"decode on the GPU", func(c *Config) { c.DecodeOnGPU, c.DecodeTokenTime = true, Duration(10*time.Millisecond) }},
	} {
		cfg := testConfig()
		c.edit(&cfg)
		rep0, lines0 := replayLines(t, src, cfg)
		rep1, lines1 := replayLines(t, src, cfg)
		if !bytes.Equal(rep0, rep1) || !bytes.Equal(lines0, lines1) {
			t.Fatalf("%s: two replays differ (reports equal: %v, lines equal: %v)", c.name,
				bytes.Equal(rep0, rep1), bytes.Equal(lines0, lines1))
		}
		var rep Report
		if err := json.Unmarshal(rep0, &rep); err != nil {
			t.Fatal(err)
		}
		byStrategy := map[string][]RequestRecord{}
		sc := bufio.NewScanner(bytes.NewReader(lines0))
		for sc.Scan() {
			var r RequestRecord
			d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
			d.DisallowUnknownFields()
			if err := d.Decode(&r); err != nil {
				t.Fatalf("%s: %v", sc.Bytes(), err)
			}
			byStrategy[r.Strategy] = append(byStrategy[r.Strategy], r)
		}
		for i := range rep.Results {
			res := &rep.Results[i]
			checkAgainstResult(t, byStrategy[res.Strategy], res, n, cfg)
		}
	}
}

// checkAgainstResult checks one strategy's records against its result.
func checkAgainstResult(t *testing.T, recs []RequestRecord, res *StrategyResult, n int, cfg Config) {
	t.Helper()
	if len(recs) != n {
		t.Fatalf("%s: %d records of %d requests", res.Strategy, len(recs), n)
	}
	seen := make([]bool, n)
	byIndex := make([]*RequestRecord, n)
	var used, host, nvme, recomputed, missed, steps int64
	var ttftSum, ttftMax float64
	for i := range recs {
		r := &recs[i]
		if r.Index < 0 || r.Index >= int64(n) || seen[r.Index] {
			t.Fatalf("%s: index %d twice or out of range", res.Strategy, r.Index)
		}
		seen[r.Index], byIndex[r.Index] = true, r
		if r.UsedGPUBlocks+r.LoadedHostBlocks+r.LoadedNVMeBlocks+r.RecomputedBlocks+r.MissedBlocks != r.Blocks {
			t.Errorf("%s: request %d: its block counts do not add up to its %d blocks: %+v", res.Strategy, r.Index, r.Blocks, r)
		}
		if r.StartSeconds < r.ArrivalSeconds || r.EndSeconds < r.ArrivalSeconds+r.TTFTSeconds || r.TTFTSeconds <= 0 {
			t.Errorf("%s: request %d: times out of order: %+v", res.Strategy, r.Index, r)
		}
		if (r.PlannedSeconds > 0) != (res.Strategy == "cost") {
			t.Errorf("%s: request %d: planned %v", res.Strategy, r.Index, r.PlannedSeconds)
		}
		used += int64(r.UsedGPUBlocks)
		host += int64(r.LoadedHostBlocks)
		nvme += int64(r.LoadedNVMeBlocks)
		recomputed += int64(r.RecomputedBlocks)
		missed += int64(r.MissedBlocks)
		steps += int64(max(0, r.OutputTokens-1))
		ttftSum += r.TTFTSeconds
		ttftMax = max(ttftMax, r.TTFTSeconds)
	}
	if used != res.UsedBlocks || host != res.Loads.FromHost || nvme != res.Loads.FromNVMe ||
		recomputed != res.Recomputes.Blocks || missed != res.MissBlocks {
		t.Errorf("%s: records sum to used %d, host %d, nvme %d, recomputed %d, missed %d; the report %d, %d, %d, %d, %d",
			res.Strategy, used, host, nvme, recomputed, missed, res.UsedBlocks, res.Loads.FromHost, res.Loads.FromNVMe,
			res.Recomputes.Blocks, res.MissBlocks)
	}
	if math.Abs(ttftSum/float64(n)-res.TTFT.Mean) > 1e-6 || math.Abs(ttftMax-res.TTFT.Max) > 1e-6 {
		t.Errorf("%s: records' TTFT mean %.9f, max %.9f; the report's %.9f, %.9f", res.Strategy, ttftSum/float64(n), ttftMax,
			res.TTFT.Mean, res.TTFT.Max)
	}
	for i := 1; i < n; i++ { // one prefill slot, first come first served
		prev, r := byIndex[i-1], byIndex[i]
		if r.StartSeconds < prev.StartSeconds {
			t.Errorf("%s: request %d started before request %d", res.Strategy, i, i-1)
		}
		if ns(r.StartSeconds) < ns(prev.ArrivalSeconds+prev.TTFTSeconds) {
			t.Errorf("%s: request %d's prefill started at %.9f s, before request %d's ended at %.9f s", res.Strategy, i,
				r.StartSeconds, i-1, prev.ArrivalSeconds+prev.TTFTSeconds)
		}
	}
	if cfg.DecodeOnGPU && (res.DecodeSteps != steps || ns(res.DecodeBusySeconds) != time.Duration(steps)*time.Duration(cfg.DecodeTokenTime)) {
		t.Errorf("%s: %d decode steps, %v busy; the records' output tokens make %d steps", res.Strategy, res.DecodeSteps,
			ns(res.DecodeBusySeconds), steps)
	}
}

// TestRequestRecordsLeaveTheReplayAlone: the report's results are the same
// with the OnRequest hook as without, and a hook's error stops the replay.
func TestRequestRecordsLeaveTheReplayAlone(t *testing.T) {
	src := firstLines(BundledSource(), 200)
	cfg := testConfig()
	plain := runOrFail(t, src, cfg)
	hooked, recs := collect(t, src, cfg)
	a, _ := json.Marshal(plain.Results)
	b, _ := json.Marshal(hooked.Results)
	if !bytes.Equal(a, b) {
		t.Error("the results differ with the OnRequest hook")
	}
	if len(recs) != 200*int(costplan.NumStrategies) {
		t.Errorf("%d records", len(recs))
	}
	// A request alone on an idle system ends its prefill when the cost
	// model said (TestReplayExecutesThePlan): its record says so too.
	for _, r := range recs {
		if r.Strategy == "cost" && r.Index == 0 && math.Abs(r.TTFTSeconds-r.PlannedSeconds) > 0.01*r.PlannedSeconds {
			t.Errorf("the first request, alone: TTFT %.9f s, planned %.9f s", r.TTFTSeconds, r.PlannedSeconds)
		}
	}
	stop := errors.New("disk full")
	calls := 0
	_, err := Run(src, cfg, Options{OnRequest: func(RequestRecord) error { calls++; return stop }})
	if !errors.Is(err, stop) || calls != 1 {
		t.Errorf("a failing hook: %v after %d calls", err, calls)
	}
}
