// Package results is the project's one format for benchmark results
// (design.md, "Benchmark results"): a JSON file per benchmark and machine,
// and the same rows as a markdown table. Every benchmark program and
// `kvtier probe` write their rows as Row.
package results

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// Row is one measured line. For rates (unit ends in "/s") Ratio is this
// row's median over its baseline's; for times it is the baseline's over this
// row's, so that above 1 is better either way.
type Row struct {
	Name     string  `json:"name"`
	Unit     string  `json:"unit"`
	Median   float64 `json:"median"`
	Min      float64 `json:"min"`
	Max      float64 `json:"max"`
	Runs     int     `json:"runs"`
	Baseline string  `json:"baseline"`
	Ratio    float64 `json:"ratio"`
	// Note marks a row that is not a measurement of its own, such as one
	// stage of a pipeline measured inside another row's runs.
	Note string `json:"note,omitempty"`
}

// File is one benchmark's results.
type File struct {
	Benchmark string `json:"benchmark"`
	Machine   string `json:"machine"`
	Date      string `json:"date"`
	Commit    string `json:"commit"`
	Command   string `json:"command"`
	Rows      []Row  `json:"rows"`
	// Notes are free-form facts about the run (device, sizes, stages).
	Notes []string `json:"notes,omitempty"`
}

// New starts a File for this process: today's date, the commit (BuildCommit
// when commit is empty) and the command line.
func New(benchmark, machine, commit string) *File {
	if commit == "" {
		commit = BuildCommit()
	}
	return &File{
		Benchmark: benchmark,
		Machine:   machine,
		Date:      time.Now().UTC().Format("2006-01-02"),
		Commit:    commit,
		Command:   strings.Join(os.Args, " "),
	}
}

// BuildCommit is the VCS revision the running binary was built from, with
// "-dirty" when the tree had uncommitted changes, or "unknown" when the
// build recorded none (go build -buildvcs=false, or outside a checkout).
func BuildCommit() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, st := range bi.Settings {
		switch st.Key {
		case "vcs.revision":
			rev = st.Value
		case "vcs.modified":
			dirty = st.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

// Median is the median of samples (the mean of the middle two for an even
// count); 0 for none.
func Median(samples []float64) float64 {
	s := slices.Clone(samples)
	slices.Sort(s)
	switch n := len(s); {
	case n == 0:
		return 0
	case n%2 == 1:
		return s[n/2]
	default:
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// Add appends a row summarising samples (at least one).
func (f *File) Add(name, unit string, samples []float64, baseline string) Row {
	r := Row{Name: name, Unit: unit, Runs: len(samples), Baseline: baseline, Ratio: 1, Median: Median(samples)}
	if len(samples) > 0 {
		r.Min, r.Max = slices.Min(samples), slices.Max(samples)
	}
	if baseline != "" {
		for _, b := range f.Rows {
			if b.Name == baseline && b.Median > 0 && r.Median > 0 {
				if strings.HasSuffix(unit, "/s") {
					r.Ratio = r.Median / b.Median
				} else {
					r.Ratio = b.Median / r.Median
				}
			}
		}
	}
	f.Rows = append(f.Rows, r)
	return r
}

// Markdown writes the rows as a table, with the command and the machine.
func (f *File) Markdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s on %s (%s)\n\n", f.Benchmark, f.Machine, f.Date)
	fmt.Fprintf(&b, "Command: `%s`  \nCommit: `%s`\n\n", f.Command, f.Commit)
	for _, n := range f.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	if len(f.Notes) > 0 {
		b.WriteString("\n")
	}
	b.WriteString("| name | unit | median | min | max | runs | baseline | ratio |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range f.Rows {
		fmt.Fprintf(&b, "| %s | %s | %.3g | %.3g | %.3g | %d | %s | %.2f |\n",
			r.Name, r.Unit, r.Median, r.Min, r.Max, r.Runs, r.Baseline, r.Ratio)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Write saves <benchmark>-<machine>.json and .md under dir.
func (f *File) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	base := filepath.Join(dir, f.Benchmark+"-"+f.Machine)
	j, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".json", append(j, '\n'), 0o644); err != nil {
		return err
	}
	md, err := os.Create(base + ".md")
	if err != nil {
		return err
	}
	if err := f.Markdown(md); err != nil {
		md.Close()
		return err
	}
	return md.Close()
}
