// Fidelity sets kvtier replay's prediction beside what the model server
// measured, for every trace and tier configuration of one run of
// benchmarks/serve/fidelity.sh: per cell (a trace, a tier configuration, a
// strategy), the TTFT p50, p90 and mean that bench-serve measured against
// the server on the GPU, the replay's of the same trace and configuration,
// and predicted over measured. The replay of a cell takes what the served
// run learned: the server's calibration (calibration-LABEL.json), its mean
// decode step (metrics-LABEL.txt) and the handling fitted from the trace's
// gpu-only run (bench-gpu-only.json, per request). It writes
// fidelity-<machine>.{json,md} under -results.
//
//	go run ./benchmarks/serve/fidelity -run DIR -results benchmarks/results
//
// DIR holds drive.json (kvtier probe --nvme of the run's disk; a trace's
// own folder may hold its own, when it was served in a call of its own) and one
// folder per trace: trace.jsonl, cells.tsv (label, strategy, host bytes,
// NVMe bytes and, optionally, the lower tiers' codec, tab separated) and
// run/ (benchmarks/serve/run.sh's output). A cell with a codec is set
// beside the cell of the same strategy and tiers without one: compressed
// over uncompressed, served and replayed (issue 37's check).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"kvtier.dev/internal/benchserve"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/replay"
)

// cell is one served run of a trace: its label in run/, its strategy and
// its tiers.
type cell struct {
	trace, label, strategy string
	host, nvme             replay.Bytes
	codec                  string // the host and NVMe tiers' (-host-codec); "" none
}

// outcome is a cell measured and predicted.
type outcome struct {
	cell
	measured, predicted results.Percentiles
	decodeStep          time.Duration
	calibration         string // the served run's, or none
}

func main() {
	log.SetFlags(0)
	runDir := flag.String("run", "", "fidelity.sh's output directory")
	resultsDir := flag.String("results", "", "write fidelity-<machine>.{json,md} here (empty: print the markdown)")
	machine := flag.String("machine", "h200", "machine name")
	commit := flag.String("commit", "", "commit the server was built from")
	base := flag.String("config", "", "a JSON file of replay.Config fields every cell's replay starts from (the served model's shapes; empty: the server's defaults as fidelity.sh runs it)")
	whole := flag.Bool("load-whole", false, "replay a run whose server did not mark its coded loads as landing whole (PrefillSample.LoadWhole): each coded cell's calibration is replayed from a copy whose loaded passes carry it")
	wave := flag.Int("attention-wave", 0, "replay a run whose server did not report its attention wave (before cost.Calibration.SetAttentionWave) with this one: each calibration is replayed from a copy whose prefill fit carries it (0: as written)")
	requestsOut := flag.String("requests-out", "", "write each cell's replayed requests (kvtier replay's --requests-out lines) to DIR/<trace>-<cell>.jsonl, to compare them with bench-<cell>.json request by request")
	flag.Parse()
	if *runDir == "" {
		log.Fatal("fidelity: -run is required")
	}
	if err := (rewrite{wave: *wave}).check(); err != nil {
		log.Fatal(err)
	}
	cfg, err := baseConfig(*base)
	if err != nil {
		log.Fatal(err)
	}
	traces, err := filepath.Glob(filepath.Join(*runDir, "*", "cells.tsv"))
	if err != nil || len(traces) == 0 {
		log.Fatalf("fidelity: no */cells.tsv under %s", *runDir)
	}
	var outs []outcome
	for _, cells := range traces {
		drive := filepath.Join(filepath.Dir(cells), "drive.json") // a trace served in a call of its own probed its own
		if _, err := os.Stat(drive); err != nil {
			drive = filepath.Join(*runDir, "drive.json")
		}
		o, err := traceOutcomes(filepath.Dir(cells), drive, cfg, *requestsOut, rewrite{wave: *wave, whole: *whole})
		if err != nil {
			log.Fatal(err)
		}
		outs = append(outs, o...)
	}
	f := results.New("serve-fidelity", *machine, *commit)
	for _, o := range outs {
		name := o.trace + " " + o.label
		for _, q := range []struct {
			what     string
			mea, pre float64
		}{{"p50", o.measured.P50, o.predicted.P50}, {"p90", o.measured.P90, o.predicted.P90}, {"mean", o.measured.Mean, o.predicted.Mean}} {
			f.Add(name+" TTFT "+q.what+" measured", "s", []float64{q.mea}, "")
			f.Add(name+" TTFT "+q.what+" predicted", "s", []float64{q.pre}, name+" TTFT "+q.what+" measured")
		}
		cal := "no calibration (the presets)"
		if o.calibration != "" {
			cal = "its calibration"
		}
		codec := ""
		if o.codec != "" {
			codec = ", codec " + o.codec
		}
		f.Notes = append(f.Notes, fmt.Sprintf("%s %s (%s, host %v, NVMe %v%s): replayed with %s and a decode step of %v",
			o.trace, o.label, o.strategy, o.host, o.nvme, codec, cal, o.decodeStep))
	}
	f.Notes = append(f.Notes, "ratio of a predicted row: measured over predicted (the results format's rule for times); the markdown's table gives predicted over measured")
	if err := write(f, outs, *resultsDir); err != nil {
		log.Fatal(err)
	}
}

// baseConfig is the replay configuration of the server as fidelity.sh
// runs it: llama-3.1-8b shapes on an H200, 2 GiB of GPU KV in 16-token
// blocks, LRU with write-through, one prefill at a time and decode between
// prefills (at most 16 at once), replies cut at bench-serve's
// --max-tokens 2.
func baseConfig(path string) (replay.Config, error) {
	cfg := replay.DefaultConfig()
	cfg.Model, cfg.GPU, cfg.BlockTokens, cfg.GPUBytes = "llama-3.1-8b", "h200", 16, 2<<30
	cfg.HostLink, cfg.Policy, cfg.WriteThrough = "pcie5-pinned", "lru", true
	cfg.PrefillSlots, cfg.DecodeOnGPU, cfg.MaxBatch, cfg.MaxOutputTokens = 1, true, 16, 2
	cfg.Baselines = false
	if path == "" {
		return cfg, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("fidelity: -config: %w", err)
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return cfg, fmt.Errorf("fidelity: -config %s: %w", path, err)
	}
	return cfg, nil
}

// traceOutcomes measures and replays every cell of the trace in dir.
// With requestsOut set, each cell's replayed requests go to
// requestsOut/<trace>-<cell>.jsonl.
func traceOutcomes(dir, drive string, base replay.Config, requestsOut string, rw rewrite) ([]outcome, error) {
	cells, err := readCells(dir)
	if err != nil {
		return nil, err
	}
	run := filepath.Join(dir, "run")
	gpuOnly, err := benchserve.ReadRun(run, "gpu-only", true)
	if err != nil {
		return nil, fmt.Errorf("fidelity: %s: the handling comes from the gpu-only run: %w", dir, err)
	}
	h, err := benchserve.FitHandling(gpuOnly)
	if err != nil {
		return nil, fmt.Errorf("fidelity: %s: bench-gpu-only.json: %w", dir, err)
	}
	var outs []outcome
	for _, c := range cells {
		o := outcome{cell: c}
		m, err := benchserve.ReadRun(run, c.label, false)
		if err != nil {
			return nil, fmt.Errorf("fidelity: %s: %w", dir, err)
		}
		o.measured = m.TTFT
		if o.decodeStep, err = decodeStep(filepath.Join(run, "metrics-"+c.label+".txt")); err != nil {
			return nil, fmt.Errorf("fidelity: %s: %w", dir, err)
		}
		cfg := base
		cfg.Strategy, cfg.HostBytes, cfg.NVMeBytes = c.strategy, c.host, c.nvme
		o.calibration = filepath.Join(run, "calibration-"+c.label+".json")
		if _, err := os.Stat(o.calibration); err != nil {
			o.calibration = "" // none written (run.sh writes none for the tiny model)
		}
		cfg.Calibration = o.calibration
		if r := rw.of(c); r != (rewrite{}) && o.calibration != "" {
			if cfg.Calibration, err = r.copy(o.calibration); err != nil {
				return nil, fmt.Errorf("fidelity: %s: %w", dir, err)
			}
			defer os.Remove(cfg.Calibration)
		}
		cfg.DecodeTokenTime = replay.Duration(o.decodeStep)
		cfg.HandlingTime, cfg.HandlingTokenTime = replay.Duration(h.PerRequest), replay.Duration(h.PerToken)
		if c.nvme > 0 {
			cfg.NVMeLink = drive
		}
		if c.codec != "" { // the server's NVMe tier follows -host-codec
			cfg.HostCodec = c.codec
			if c.nvme > 0 {
				cfg.NVMeCodec = c.codec
			}
		}
		rep, err := replayCell(filepath.Join(dir, "trace.jsonl"), cfg, requestsOut, c)
		if err != nil {
			return nil, fmt.Errorf("fidelity: replay of %s %s: %w", c.trace, c.label, err)
		}
		for _, r := range rep.Results {
			if r.Strategy == c.strategy {
				o.predicted = r.TTFT
			}
		}
		outs = append(outs, o)
	}
	return outs, nil
}

// replayCell replays one cell, writing its request records under
// requestsOut when set.
func replayCell(trace string, cfg replay.Config, requestsOut string, c cell) (*replay.Report, error) {
	if requestsOut == "" {
		return replay.Run(replay.FileSource(trace), cfg, replay.Options{})
	}
	f, err := os.Create(filepath.Join(requestsOut, c.trace+"-"+c.label+".jsonl"))
	if err != nil {
		return nil, fmt.Errorf("fidelity: -requests-out: %w", err)
	}
	w := bufio.NewWriter(f)
	rep, err := replay.Run(replay.FileSource(trace), cfg, replay.Options{OnRequest: replay.RequestLines(w)})
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return rep, err
}

// readCells reads dir/cells.tsv: label, strategy, host and NVMe bytes.
func readCells(dir string) ([]cell, error) {
	path := filepath.Join(dir, "cells.tsv")
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("fidelity: %w", err)
	}
	defer f.Close()
	var cells []cell
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		fs := strings.Split(sc.Text(), "\t")
		if len(fs) != 4 && len(fs) != 5 {
			return nil, fmt.Errorf("fidelity: %s:%d: %d fields, want label, strategy, host, nvme and an optional codec", path, n, len(fs))
		}
		c := cell{trace: filepath.Base(dir), label: fs[0], strategy: fs[1]}
		if len(fs) == 5 && fs[4] != "none" {
			c.codec = fs[4]
		}
		if err := c.host.Set(fs[2]); err != nil {
			return nil, fmt.Errorf("fidelity: %s:%d: host %q: %w", path, n, fs[2], err)
		}
		if err := c.nvme.Set(fs[3]); err != nil {
			return nil, fmt.Errorf("fidelity: %s:%d: nvme %q: %w", path, n, fs[3], err)
		}
		cells = append(cells, c)
	}
	return cells, sc.Err()
}

// decodeStep is the mean of the server's kvserve_decode_step_seconds.
func decodeStep(metrics string) (time.Duration, error) {
	b, err := os.ReadFile(metrics)
	if err != nil {
		return 0, err
	}
	var sum, count float64
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		switch name {
		case "kvserve_decode_step_seconds_sum":
			sum, err = strconv.ParseFloat(v, 64)
		case "kvserve_decode_step_seconds_count":
			count, err = strconv.ParseFloat(v, 64)
		}
		if err != nil {
			return 0, fmt.Errorf("%s: %s: %w", metrics, name, err)
		}
	}
	if count == 0 {
		return 0, fmt.Errorf("%s: no decode step recorded (kvserve_decode_step_seconds)", metrics)
	}
	return time.Duration(sum / count * 1e9), nil
}

// writeCodecRatios writes, for each cell with a codec whose cell without
// one (same trace, strategy and tiers) ran too, compressed over
// uncompressed TTFT p50 and mean, served and replayed.
func writeCodecRatios(b *strings.Builder, outs []outcome) {
	header := false
	for _, c := range outs {
		if c.codec == "" {
			continue
		}
		for _, u := range outs {
			if u.codec != "" || u.trace != c.trace || u.strategy != c.strategy || u.host != c.host || u.nvme != c.nvme {
				continue
			}
			if !header {
				fmt.Fprintf(b, "\n| trace | compressed / uncompressed | served p50 / mean | replayed p50 / mean | replayed over served |\n|---|---|---|---|---|\n")
				header = true
			}
			mp, mm := c.measured.P50/u.measured.P50, c.measured.Mean/u.measured.Mean
			pp, pm := c.predicted.P50/u.predicted.P50, c.predicted.Mean/u.predicted.Mean
			fmt.Fprintf(b, "| %s | %s / %s | %.3f / %.3f | %.3f / %.3f | %.3f / %.3f |\n", c.trace, c.label, u.label, mp, mm, pp, pm, pp/mp, pm/mm)
		}
	}
}

// write writes f and the ratio table to dir, or prints the table.
func write(f *results.File, outs []outcome, dir string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "| trace | server | measured p50 / p90 / mean | predicted p50 / p90 / mean | predicted over measured |\n|---|---|---|---|---|\n")
	ms := func(p results.Percentiles) string {
		return fmt.Sprintf("%.1f / %.1f / %.1f ms", 1e3*p.P50, 1e3*p.P90, 1e3*p.Mean)
	}
	for _, o := range outs {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.3f / %.3f / %.3f |\n", o.trace, o.label, ms(o.measured), ms(o.predicted),
			o.predicted.P50/o.measured.P50, o.predicted.P90/o.measured.P90, o.predicted.Mean/o.measured.Mean)
	}
	writeCodecRatios(&b, outs)
	if dir == "" {
		fmt.Print(b.String())
		return nil
	}
	if err := f.Write(dir); err != nil {
		return err
	}
	md, err := os.OpenFile(filepath.Join(dir, f.Benchmark+"-"+f.Machine+".md"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(md, "\n## Predicted over measured\n\n%s", b.String()); err != nil {
		md.Close()
		return err
	}
	return md.Close()
}

// rewrite is what a calibration file of a run older than the fields it
// sets is replayed with: the attention wave (PrefillFit.AttentionWave)
// and, for a coded cell, its loaded passes marked as landing whole
// (PrefillSample.LoadWhole). Fields a file has are kept.
type rewrite struct {
	wave  int
	whole bool
}

// check refuses a wave no runtime has.
func (r rewrite) check() error {
	if r.wave < 0 {
		return fmt.Errorf("fidelity: -attention-wave %d is negative (0: as the files say)", r.wave)
	}
	return nil
}

// of is r for cell c: the loads landing whole only where c is coded.
func (r rewrite) of(c cell) rewrite {
	r.whole = r.whole && c.codec != ""
	return r
}

// copy writes a copy of the calibration file path with r's fields and
// returns the copy's path.
func (r rewrite) copy(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var file map[string]json.RawMessage
	if err := json.Unmarshal(data, &file); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if r.wave > 0 {
		var prefill map[string]json.RawMessage
		if err := json.Unmarshal(file["prefill"], &prefill); err != nil {
			return "", fmt.Errorf("%s: prefill: %w", path, err)
		}
		if _, ok := prefill["attention_wave"]; !ok {
			prefill["attention_wave"] = json.RawMessage(strconv.Itoa(r.wave))
		}
		if file["prefill"], err = json.Marshal(prefill); err != nil {
			return "", err
		}
	}
	if r.whole {
		var samples []map[string]json.RawMessage
		if err := json.Unmarshal(file["prefill_samples"], &samples); err != nil {
			return "", fmt.Errorf("%s: prefill_samples: %w", path, err)
		}
		for _, s := range samples {
			if _, loaded := s["load_bytes"]; loaded {
				if _, ok := s["load_whole"]; !ok {
					s["load_whole"] = json.RawMessage("true")
				}
			}
		}
		if file["prefill_samples"], err = json.Marshal(samples); err != nil {
			return "", err
		}
	}
	if data, err = json.Marshal(file); err != nil {
		return "", err
	}
	f, err := os.CreateTemp("", "fidelity-calibration-*.json")
	if err != nil {
		return "", err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), f.Close()
}
