package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"kvtier.dev/internal/results"
)

// row is one line of results, in the project's format.
type row = results.Row

type report struct {
	Benchmark string `json:"benchmark"`
	Machine   string `json:"machine"`
	Date      string `json:"date"`
	Commit    string `json:"commit"`
	Command   string `json:"command"`
	Rows      []row  `json:"rows"`
}

// series collects the samples of one row in the order rows first appear.
type series struct {
	names    []string
	samples  map[string][]float64
	baseline map[string]string
	notes    map[string]string
}

func newSeries() *series {
	return &series{samples: map[string][]float64{}, baseline: map[string]string{}, notes: map[string]string{}}
}

func (s *series) add(name, baseline, note string, v float64) {
	if _, ok := s.samples[name]; !ok {
		s.names = append(s.names, name)
	}
	s.samples[name] = append(s.samples[name], v)
	s.baseline[name] = baseline
	if note != "" {
		s.notes[name] = note
	}
}

// rows summarizes the samples; ratio is the row's median over its
// baseline's median (1 for a baseline row, 0 where there is none).
func (s *series) rows() []row {
	var out []row
	for _, name := range s.names {
		v := s.samples[name]
		r := row{Name: name, Unit: "GiB/s", Median: results.Median(v), Min: slices.Min(v), Max: slices.Max(v), Runs: len(v),
			Baseline: s.baseline[name], Note: s.notes[name]}
		switch {
		case r.Baseline == "" && r.Note == "":
			r.Ratio = 1
		case r.Baseline != "":
			if b, ok := s.samples[r.Baseline]; ok && results.Median(b) > 0 {
				r.Ratio = r.Median / results.Median(b)
			}
		}
		out = append(out, r)
	}
	return out
}

func round2(x float64) float64 {
	return float64(int64(x*100+0.5)) / 100
}

// write saves alloc-<machine>.json and alloc-<machine>.md under dir.
func write(dir string, rep report, preamble []string, vmmOf func(string) string) error {
	for i := range rep.Rows {
		r := &rep.Rows[i]
		r.Median, r.Min, r.Max, r.Ratio = round2(r.Median), round2(r.Min), round2(r.Max), round2(r.Ratio)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	base := filepath.Join(dir, "alloc-"+rep.Machine)
	if err := os.WriteFile(base+".json", append(js, '\n'), 0o644); err != nil {
		return err
	}
	medians := map[string]float64{}
	for _, r := range rep.Rows {
		medians[r.Name] = r.Median
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Pinned allocation: %s, %s\n\n", rep.Machine, rep.Date)
	fmt.Fprintf(&b, "Commit `%s`. Command:\n\n    %s\n\n", rep.Commit, rep.Command)
	for _, l := range preamble {
		fmt.Fprintf(&b, "%s\n", l)
	}
	fmt.Fprintf(&b, "\n| path | median GiB/s | min | max | runs | x baseline | x VMM |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Rows {
		ratio, vmm := "", ""
		if r.Baseline != "" || r.Note == "" {
			ratio = fmt.Sprintf("%.2f", r.Ratio)
		}
		if v := vmmOf(r.Name); v != "" && medians[v] > 0 && r.Note == "" {
			vmm = fmt.Sprintf("%.2f", r.Median/medians[v])
		}
		name := r.Name
		if r.Note != "" {
			name += " (" + r.Note + ")"
		}
		fmt.Fprintf(&b, "| %s | %.2f | %.2f | %.2f | %d | %s | %s |\n", name, r.Median, r.Min, r.Max, r.Runs, ratio, vmm)
	}
	return os.WriteFile(base+".md", []byte(b.String()), 0o644)
}
