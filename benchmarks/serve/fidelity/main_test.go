package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvtier.dev/internal/results"
)

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReadCells: a cells.tsv line with another number of fields, or a size
// that does not parse, is an error naming the file, the line and the field.
func TestReadCells(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "chat")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "cells.tsv", "cost-host4\tcost\t4GiB\t40GiB\ngpu-only\tgpu-only\t32GiB\t0\ncost-host4-fp8\tcost\t4GiB\t40GiB\tfp8-e4m3\n")
	cells, err := readCells(dir)
	if err != nil || len(cells) != 3 || cells[0].host != 4<<30 || cells[0].nvme != 40<<30 || cells[1].trace != "chat" ||
		cells[0].codec != "" || cells[2].codec != "fp8-e4m3" {
		t.Fatalf("cells %+v, %v", cells, err)
	}
	for body, want := range map[string]string{
		"cost\tcost\t4GiB\n":             "cells.tsv:1: 3 fields",
		"a\tcost\t4GiB\t0\nb\tc\tx\t0\n": "cells.tsv:2: host \"x\"",
		"a\tcost\t4GiB\tlots\n":          "cells.tsv:1: nvme \"lots\"",
	} {
		writeFile(t, dir, "cells.tsv", body)
		if _, err := readCells(dir); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error with %q", body, err, want)
		}
	}
}

// TestDecodeStep: the mean of kvserve_decode_step_seconds; a run that
// recorded no step is an error naming the series.
func TestDecodeStep(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "m.txt", "# HELP x\nkvserve_decode_step_seconds_sum 0.5\nkvserve_decode_step_seconds_count 40\n")
	if d, err := decodeStep(p); err != nil || d != 12500*time.Microsecond {
		t.Errorf("decode step %v, %v; want 12.5ms", d, err)
	}
	p = writeFile(t, dir, "none.txt", "kvserve_decode_step_seconds_count 0\n")
	if _, err := decodeStep(p); err == nil || !strings.Contains(err.Error(), "kvserve_decode_step_seconds") {
		t.Errorf("no steps: %v", err)
	}
	p = writeFile(t, dir, "bad.txt", "kvserve_decode_step_seconds_sum x\n")
	if _, err := decodeStep(p); err == nil || !strings.Contains(err.Error(), "kvserve_decode_step_seconds_sum") {
		t.Errorf("a bad value: %v", err)
	}
}

// TestReplayCellRequestsOut: -requests-out writes one replayed request a
// line per cell, and a directory that cannot take the file is an error
// naming the flag.
func TestReplayCellRequestsOut(t *testing.T) {
	dir := t.TempDir()
	trace := writeFile(t, dir, "trace.jsonl", `{"arrival_us":0,"salt":0,"block_tokens":16,"input_tokens":32,"output_tokens":2,"keys":[1,2]}
{"arrival_us":1000,"salt":0,"block_tokens":16,"input_tokens":48,"output_tokens":2,"keys":[1,2,3]}
`)
	cfg, err := baseConfig("")
	if err != nil {
		t.Fatal(err)
	}
	c := cell{trace: "t", label: "gpu-only", strategy: "gpu-only", host: 1 << 30}
	cfg.Strategy, cfg.HostBytes = c.strategy, c.host
	if _, err := replayCell(trace, cfg, dir, c); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "t-gpu-only.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n != 2 {
		t.Errorf("%d request lines, want 2:\n%s", n, b)
	}
	if _, err := replayCell(trace, cfg, filepath.Join(dir, "no", "such"), c); err == nil || !strings.Contains(err.Error(), "-requests-out") {
		t.Errorf("a missing -requests-out directory: %v, want an error naming the flag", err)
	}
}

// TestCodecRatios: a cell with a codec is set beside the cell of the same
// trace, strategy and tiers without one; a cell without its pair is not.
func TestCodecRatios(t *testing.T) {
	pct := func(p50, mean float64) results.Percentiles { return results.Percentiles{P50: p50, Mean: mean} }
	base := cell{trace: "agentic", label: "cost-host4", strategy: "cost", host: 4 << 30, nvme: 40 << 30}
	fp8 := base
	fp8.label, fp8.codec = "cost-host4-fp8", "fp8-e4m3"
	lone := fp8
	lone.label, lone.host = "cost-host8-fp8", 8<<30
	outs := []outcome{
		{cell: base, measured: pct(0.4, 1.0), predicted: pct(0.5, 1.0)},
		{cell: fp8, measured: pct(0.2, 0.8), predicted: pct(0.3, 0.6)},
		{cell: lone, measured: pct(0.1, 0.1), predicted: pct(0.1, 0.1)},
	}
	var b strings.Builder
	writeCodecRatios(&b, outs)
	want := "| agentic | cost-host4-fp8 / cost-host4 | 0.500 / 0.800 | 0.600 / 0.600 | 1.200 / 0.750 |"
	if !strings.Contains(b.String(), want) || strings.Contains(b.String(), "cost-host8-fp8") {
		t.Errorf("codec ratios:\n%s\nwant the row %s and none for cost-host8-fp8", b.String(), want)
	}
}

// TestRewriteCopy: a copy of a calibration file carries the wave unless
// the file has one, marks the loaded passes whole (only those), and keeps
// the rest; a file that is not JSON and a negative wave are refused.
func TestRewriteCopy(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "calibration.json")
	in := `{"version":1,"gpu":"h200","prefill":{"fixed_seconds":0.001},"links":[],` +
		`"prefill_samples":[{"model":"m","prefix":0,"tokens":16,"seconds":0.01},` +
		`{"model":"m","prefix":16,"tokens":16,"seconds":0.02,"load_bytes":100,"load_blocks":1,"load_link":"l"}],"copy_samples":[]}`
	if err := os.WriteFile(path, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := rewrite{wave: 16896, whole: true}.copy(path)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(out)
	var f struct {
		Prefill struct {
			Fixed float64 `json:"fixed_seconds"`
			Wave  int     `json:"attention_wave"`
		} `json:"prefill"`
		Samples []struct {
			Whole bool `json:"load_whole"`
		} `json:"prefill_samples"`
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if f.Prefill.Wave != 16896 || f.Prefill.Fixed != 0.001 || len(f.Samples) != 2 || f.Samples[0].Whole || !f.Samples[1].Whole {
		t.Errorf("the copy: %+v; want the wave, the fit kept, and only the loaded pass whole", f)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte("not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (rewrite{wave: 1}).copy(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("a file that is not JSON: %v, want an error naming it", err)
	}
	if err := (rewrite{wave: -1}).check(); err == nil || !strings.Contains(err.Error(), "-attention-wave") {
		t.Errorf("a negative wave: %v, want an error naming -attention-wave", err)
	}
}
