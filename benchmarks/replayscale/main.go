// Command replayscale measures what `kvtier replay` costs at the scale of
// real traces: the CPU time (user and system) and the peak resident memory
// of the process, as wait4's rusage reports them (the figures
// /usr/bin/time -v prints), for 10,000 requests of the agentic generator on
// the default configuration (Llama-3.1-8B on an H200, 40 GiB of GPU KV, a
// 256 GiB host tier, 2 TiB of NVMe, the cost strategy and the four
// baselines), under the device mover and the model mover.
//
// It runs the kvtier binary given by -kvtier and, with -baseline, an older
// one too (the same command, say built from the commit before a change),
// each with both movers, -rounds times, the order alternating by round:
// the machine's load falls on each alike. Each row is one binary and mover;
// the ratios are against the model mover of the same binary and, for the
// baseline's rows' counterparts, against the baseline. The replay's output
// is compared across runs of one binary and mover: a replay is
// deterministic, so a difference is an error.
//
//	go build -o /tmp/kvr ./cmd/kvtier && go run ./benchmarks/replayscale -kvtier /tmp/kvr -machine dev-2core
package main

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"kvtier.dev/internal/results"
)

// options are the command's flags.
type options struct {
	kvtier, baseline, machine, out string
	commit, baselineCommit         string
	notes                          []string
	requests, rounds               int
}

func main() {
	var o options
	flag.StringVar(&o.kvtier, "kvtier", "", "the kvtier binary to measure (go build -o /tmp/kvr ./cmd/kvtier)")
	flag.StringVar(&o.baseline, "baseline", "", "an older kvtier binary to measure beside it (empty: none)")
	flag.IntVar(&o.requests, "requests", 10000, "requests of the agentic generator")
	flag.IntVar(&o.rounds, "rounds", 3, "runs of each binary and mover")
	flag.StringVar(&o.machine, "machine", "local", "machine name for the results files")
	flag.Func("note", "a line on the machine or the binaries, for the results (repeatable)", func(s string) error {
		o.notes = append(o.notes, s)
		return nil
	})
	flag.StringVar(&o.commit, "commit", "", "the commit -kvtier was built from (empty: what its build info says, if anything)")
	flag.StringVar(&o.baselineCommit, "baseline-commit", "", "the commit -baseline was built from (empty: what its build info says)")
	flag.StringVar(&o.out, "out", "benchmarks/results", "directory for replayscale-<machine>.json and .md")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "replayscale:", err)
		os.Exit(1)
	}
}

// variant is one binary under one mover, and what its runs measured.
type variant struct {
	name, bin, mover string
	cpu, rss         []float64 // seconds; MB (10^6 bytes)
	output           [sha256.Size]byte
}

func run(o options) error {
	if o.kvtier == "" {
		return errors.New("-kvtier: the binary to measure is required")
	}
	if o.requests < 1 || o.rounds < 1 {
		return fmt.Errorf("-requests %d, -rounds %d: both must be at least 1", o.requests, o.rounds)
	}
	type binary struct{ label, path, commit string }
	bins := []binary{{"", o.kvtier, o.commit}}
	if o.baseline != "" {
		bins = append(bins, binary{"baseline ", o.baseline, o.baselineCommit})
	}
	var vs []*variant
	for _, b := range bins {
		if _, err := os.Stat(b.path); err != nil {
			return err
		}
		if b.commit == "" {
			b.commit = commitOf(b.path)
		}
		for _, m := range []string{"device", "model"} {
			vs = append(vs, &variant{name: fmt.Sprintf("%s%s (%s)", b.label, m, b.commit), bin: b.path, mover: m})
		}
	}
	for round := range o.rounds {
		for i := range vs {
			v := vs[i]
			if round%2 == 1 {
				v = vs[len(vs)-1-i]
			}
			if err := measure(v, o.requests, round); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "round %d: %s: %.1f s CPU, %.0f MB\n", round, v.name, v.cpu[round], v.rss[round])
		}
	}
	return write(o, vs)
}

// args is the replay's command line after the binary.
func args(requests int, mover string) []string {
	return []string{"replay", "--generate", "agentic", "--requests", strconv.Itoa(requests), "--progress", "never", "--mover", mover}
}

// measure runs v once and adds its CPU time and peak RSS.
func measure(v *variant, requests, round int) error {
	cmd := exec.Command(v.bin, args(requests, v.mover)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", v.bin, strings.Join(cmd.Args[1:], " "), err, errb.String())
	}
	cpu, rssBytes, err := usage(cmd.ProcessState)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(out.Bytes())
	if round > 0 && sum != v.output {
		return fmt.Errorf("%s: the output of round %d differs from round 0's: the replay is not deterministic", v.name, round)
	}
	v.output = sum
	v.cpu, v.rss = append(v.cpu, cpu.Seconds()), append(v.rss, float64(rssBytes)/1e6)
	return nil
}

// commandLine is this run's command as typed: go run and the flags, a
// flag with a space quoted.
func commandLine() string {
	parts := []string{"go run ./benchmarks/replayscale"}
	for _, a := range os.Args[1:] {
		if strings.ContainsAny(a, " '\"") {
			a = strconv.Quote(a)
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// commitOf is the commit bin was built from, as its build info says
// ("commit unknown" when it says none: built with -buildvcs=false).
func commitOf(bin string) string {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return "commit unknown"
	}
	rev, dirty := "commit unknown", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value[:min(len(s.Value), 7)]
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

// write saves the rows, for CPU then RSS: the baseline's model and device
// movers, then the measured binary's, each device mover against the model
// mover of its binary, and the measured binary against the baseline.
func write(o options, vs []*variant) error {
	commit := o.commit
	if commit == "" {
		commit = commitOf(o.kvtier)
	}
	f := results.New("replayscale", o.machine, commit)
	f.Command = commandLine() + "; each run: KVTIER " + strings.Join(args(o.requests, "MOVER"), " ")
	f.Notes = append(f.Notes, o.notes...)
	f.Notes = append(f.Notes,
		"CPU is user plus system time of the process and RSS its peak (wait4's rusage, as /usr/bin/time -v reports them); the default configuration (8B, 40 GiB GPU KV, host 256 GiB, NVMe 2 TiB, the cost strategy and four baselines)",
		"ratio: a device row's is its binary's model mover's figure over its own (0.5: twice the model's); the measured binary's rows against the baseline's are the baseline's figure over this one's (above 1: less than before)")
	dev, model := vs[0], vs[1]
	for _, m := range []string{"CPU", "max RSS"} {
		unit := "s"
		pick := func(v *variant) []float64 { return v.cpu }
		if m == "max RSS" {
			unit = "MB"
			pick = func(v *variant) []float64 { return v.rss }
		}
		name := func(v *variant) string { return v.name + ": " + m }
		modelBase := ""
		if len(vs) > 2 {
			bdev, bmodel := vs[2], vs[3]
			f.Add(name(bmodel), unit, pick(bmodel), "")
			f.Add(name(bdev), unit, pick(bdev), name(bmodel))
			modelBase = name(bmodel)
		}
		f.Add(name(model), unit, pick(model), modelBase)
		f.Add(name(dev), unit, pick(dev), name(model))
		if len(vs) > 2 {
			f.Add(name(dev)+", against the baseline", unit, pick(dev), name(vs[2]))
		}
	}
	return f.Write(o.out)
}
