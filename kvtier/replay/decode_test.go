package replay

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"kvtier.dev/kvtier/costplan"
)

// passFloor is the shortest prefill on cfg: one forward pass, which reads
// every weight from HBM (kvtier/cost's Scenario.PassFloor).
func passFloor(t *testing.T, cfg Config) time.Duration {
	t.Helper()
	return startedEngine(t, cfg).floor
}

// tinyLine is a request of one block of 16 tokens (its prefill is the pass
// floor: its compute takes far less), arriving at ms, generating out
// tokens; id is its block, never seen before.
func tinyLine(ms, out, id int) string {
	return fmt.Sprintf(`{"timestamp": %d, "input_length": 16, "output_length": %d, "hash_ids": [%d]}`+"\n", ms, out, id)
}

// want is a request's expected times on the virtual clock.
type want struct {
	index            int64
	start, ttft, end time.Duration
}

func checkRecords(t *testing.T, recs []RequestRecord, strategy string, wants []want) {
	t.Helper()
	var got []RequestRecord
	for _, r := range recs {
		if r.Strategy == strategy {
			got = append(got, r)
		}
	}
	if len(got) != len(wants) {
		t.Fatalf("%s: %d records, want %d", strategy, len(got), len(wants))
	}
	for i, w := range wants {
		r := got[i] // in the order the requests end
		if r.Index != w.index || ns(r.StartSeconds) != w.start || ns(r.TTFTSeconds) != w.ttft || ns(r.EndSeconds) != w.end {
			t.Errorf("%s: record %d: index %d, start %v, TTFT %v, end %v; want index %d, start %v, TTFT %v, end %v",
				strategy, i, r.Index, ns(r.StartSeconds), ns(r.TTFTSeconds), ns(r.EndSeconds), w.index, w.start, w.ttft, w.end)
		}
	}
}

// TestDecodeOnGPUByHand: four requests whose prefills are one pass floor F
// each, decode steps of D = 10 ms, timed by hand as the model server's
// scheduler runs them, one prefill then one round of decode steps:
//
//	A arrives at 0, 4 tokens: prefill [0, F], first token at F; its 3
//	  decode steps run in the rounds after each prefill.
//	B arrives at 5 ms, during A's first step [F, F+D]: its prefill waits
//	  for that round, [F+D, 2F+D]; TTFT 2F+D-5ms. 3 tokens.
//	The round after it: A's step, then B's [2F+D, 2F+3D].
//	C arrives at 25 ms, during that round: prefill [2F+3D, 3F+3D]; TTFT
//	  3F+3D-25ms. 2 tokens.
//	The round after it: A's last step (A ends at 3F+4D), B's last (3F+5D),
//	  C's only one (3F+6D).
//	E arrives at 100 ms on an idle GPU, 1 token: TTFT F, ends at its
//	  first token.
//
// Without decode_on_gpu every prefill starts at its arrival (the GPU is
// free each time) and decode only delays the ends. Nothing is cached, so
// every strategy gives the same times.
func TestDecodeOnGPUByHand(t *testing.T) {
	cfg := DefaultConfig()
	const D, ms = 10 * time.Millisecond, time.Millisecond
	cfg.DecodeTokenTime = Duration(D)
	F := passFloor(t, cfg)
	src := stringSource("by-hand", tinyLine(0, 4, 1)+tinyLine(5, 3, 2)+tinyLine(25, 2, 3)+tinyLine(100, 1, 4))

	off, offRecs := collect(t, src, cfg)
	cfg.DecodeOnGPU = true
	on, onRecs := collect(t, src, cfg)
	for s := range costplan.NumStrategies {
		checkRecords(t, onRecs, s.String(), []want{
			{0, 0, F, 3*F + 4*D},
			{1, F + D, 2*F + D - 5*ms, 3*F + 5*D},
			{2, 2*F + 3*D, 3*F + 3*D - 25*ms, 3*F + 6*D},
			{3, 100 * ms, F, 100*ms + F},
		})
		checkRecords(t, offRecs, s.String(), []want{ // B ends first: its decode is shorter
			{1, 5 * ms, F, 5*ms + F + 2*D},
			{0, 0, F, F + 3*D},
			{2, 25 * ms, F, 25*ms + F + D},
			{3, 100 * ms, F, 100*ms + F},
		})
	}
	for i := range on.Results {
		r, o := &on.Results[i], &off.Results[i]
		if r.DecodeSteps != 6 || ns(r.DecodeBusySeconds) != 6*D || r.MaxDecoding != 3 {
			t.Errorf("%s: %d decode steps, %v busy, at most %d decoding; want 6, %v, 3", r.Strategy, r.DecodeSteps,
				ns(r.DecodeBusySeconds), r.MaxDecoding, 6*D)
		}
		if ns(r.SpanSeconds) != 100*ms+F || ns(r.TTFT.Max) != 3*F+3*D-25*ms {
			t.Errorf("%s: span %v, TTFT max %v", r.Strategy, ns(r.SpanSeconds), ns(r.TTFT.Max))
		}
		if o.DecodeSteps != 0 || o.DecodeBusySeconds != 0 || o.MaxDecoding != 0 || o.OfferedGPULoad != 0 {
			t.Errorf("%s without decode_on_gpu: decode counted: %+v", o.Strategy, o)
		}
	}
	// The offered load counts the decode steps: 6 D over the 100 ms of
	// arrivals, beside the prefills.
	if g, p := on.Results[0].OfferedGPULoad, on.Results[0].OfferedPrefillLoad; math.Abs(g-p-0.6) > 1e-9 {
		t.Errorf("offered GPU load %.6f, prefill %.6f: the decode's share is not 6 x 10 ms over 100 ms", g, p)
	}
	var txt strings.Builder
	if err := on.WriteText(&txt); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"on the GPU between prefills", "at most 16 at once", "with decode, ", "decode on the GPU, between prefills", "cost 60.0 ms, 6, 3"} {
		if !strings.Contains(txt.String(), w) {
			t.Errorf("the report lacks %q:\n%s", w, txt.String())
		}
	}
}

// TestDecodeOnGPUMaxBatch: while max_batch requests decode, no prefill
// starts. A (3 tokens) arrives at 0, B at 5 ms: with a batch of 1, B's
// prefill waits for both of A's steps, [F, F+2D]; with the default of 16,
// for one round.
func TestDecodeOnGPUMaxBatch(t *testing.T) {
	cfg := DefaultConfig()
	const D, ms = 10 * time.Millisecond, time.Millisecond
	cfg.DecodeTokenTime, cfg.DecodeOnGPU, cfg.Baselines = Duration(D), true, false
	F := passFloor(t, cfg)
	src := stringSource("batch", tinyLine(0, 3, 1)+tinyLine(5, 1, 2))
	_, recs := collect(t, src, cfg)
	checkRecords(t, recs, "cost", []want{{1, F + D, 2*F + D - 5*ms, 2*F + D}, {0, 0, F, 2*F + 2*D}})
	cfg.MaxBatch = 1
	rep, recs := collect(t, src, cfg)
	checkRecords(t, recs, "cost", []want{{0, 0, F, F + 2*D}, {1, F + 2*D, 2*F + 2*D - 5*ms, 2*F + 2*D}})
	if r := rep.Results[0]; r.MaxDecoding != 1 {
		t.Errorf("at most %d decoding with max_batch 1", r.MaxDecoding)
	}
}

// TestDecodeOnGPUConfig: decode_on_gpu needs one prefill slot, and
// max_batch needs decode_on_gpu; the errors name the field. Both fields
// load from JSON.
func TestDecodeOnGPUConfig(t *testing.T) {
	for _, c := range []struct{ json, field string }{
		{`{"decode_on_gpu": true, "prefill_slots": 0}`, "decode_on_gpu"},
		{`{"decode_on_gpu": true, "prefill_slots": 2}`, "decode_on_gpu"},
		{`{"decode_on_gpu": "yes"}`, "decode_on_gpu"},
		{`{"decode_on_gpu": true, "max_batch": -1}`, "max_batch"},
		{`{"max_batch": 4}`, "max_batch"},
	} {
		_, err := LoadConfig(strings.NewReader(c.json))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%s: error %v, want one naming %s", c.json, err, c.field)
		}
	}
	cfg, err := LoadConfig(strings.NewReader(`{"decode_on_gpu": true, "max_batch": 8}`))
	if err != nil || !cfg.DecodeOnGPU || cfg.MaxBatch != 8 {
		t.Errorf("loaded %+v, %v", cfg, err)
	}
	cfg = DefaultConfig()
	cfg.DecodeOnGPU, cfg.PrefillSlots = true, 4
	_, err = Run(stringSource("one", tinyLine(0, 2, 1)), cfg, Options{})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "decode_on_gpu" || !strings.Contains(err.Error(), "prefill_slots 1") {
		t.Errorf("Run with 4 slots: %v", err)
	}
}

// TestDefaultReportHasNoDecodeFields: without decode_on_gpu the report's
// JSON is as it was: the new fields are left out, not written as zeros.
func TestDefaultReportHasNoDecodeFields(t *testing.T) {
	cfg := DefaultConfig()
	rep := runOrFail(t, firstLines(BundledSource(), 50), cfg)
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"decode_on_gpu", "max_batch", "decode_busy_s", "decode_steps", "max_decoding", "offered_gpu_load", "planned_s"} {
		if strings.Contains(b.String(), `"`+k+`"`) {
			t.Errorf("the default report has %q", k)
		}
	}
	var txt strings.Builder
	if err := rep.WriteText(&txt); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(txt.String(), "on the GPU") || !strings.Contains(txt.String(), "decode 30ms per token; prefills queue for one GPU\n") {
		t.Errorf("the default text report changed:\n%s", txt.String())
	}
}

// TestMaxOutputTokens: max_output_tokens caps each request's output as
// bench-serve --max-tokens caps what it sends: with a cap of 2, A's decode
// takes one step, not three; a negative cap is an error naming the field.
func TestMaxOutputTokens(t *testing.T) {
	cfg := DefaultConfig()
	const D = 10 * time.Millisecond
	cfg.DecodeTokenTime, cfg.DecodeOnGPU, cfg.MaxOutputTokens = Duration(D), true, 2
	F := passFloor(t, cfg)
	_, recs := collect(t, stringSource("capped", tinyLine(0, 4, 1)), cfg)
	checkRecords(t, recs, costplan.Cost.String(), []want{{0, 0, F, F + D}})
	_, err := LoadConfig(strings.NewReader(`{"max_output_tokens": -1}`))
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "max_output_tokens" {
		t.Errorf("max_output_tokens -1: %v", err)
	}
}

// TestHandlingByHand: a request's handling (2 ms, and 100 us for each of
// its 16 prompt tokens: H = 3.6 ms) is added to its TTFT, beside the GPU:
// the by-hand schedule of TestDecodeOnGPUByHand keeps its starts and ends,
// and each TTFT, the report's maximum included, is H longer.
func TestHandlingByHand(t *testing.T) {
	cfg := DefaultConfig()
	const D, ms = 10 * time.Millisecond, time.Millisecond
	cfg.DecodeTokenTime, cfg.DecodeOnGPU = Duration(D), true
	F := passFloor(t, cfg)
	src := stringSource("by-hand", tinyLine(0, 4, 1)+tinyLine(5, 3, 2)+tinyLine(25, 2, 3)+tinyLine(100, 1, 4))
	cfg.HandlingTime, cfg.HandlingTokenTime = Duration(2*ms), Duration(100*time.Microsecond)
	const H = 3600 * time.Microsecond
	rep, recs := collect(t, src, cfg)
	for s := range costplan.NumStrategies {
		checkRecords(t, recs, s.String(), []want{
			{0, 0, F + H, 3*F + 4*D},
			{1, F + D, 2*F + D - 5*ms + H, 3*F + 5*D},
			{2, 2*F + 3*D, 3*F + 3*D - 25*ms + H, 3*F + 6*D},
			{3, 100 * ms, F + H, 100*ms + F},
		})
	}
	for _, r := range rep.Results {
		if ns(r.TTFT.Max) != 3*F+3*D-25*ms+H {
			t.Errorf("%s: TTFT max %v, want %v", r.Strategy, ns(r.TTFT.Max), 3*F+3*D-25*ms+H)
		}
	}
}
