package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"kvtier.dev/internal/results"
)

// write writes the results (to c.resultsDir, or as markdown on stdout),
// then fails if the server answered a 5xx, never answered 429 or did not
// stop cleanly.
func (o *outcome) write(c *config) error {
	f := results.New("serve-load", c.machine, c.commit)
	f.Command = strings.Join(os.Args, " ")
	f.Notes = append(f.Notes, o.notes(c)...)
	fiveXX := o.fiveXX()
	o.addRows(f, fiveXX)
	var werr error
	if c.resultsDir == "" {
		werr = f.Markdown(os.Stdout)
	} else {
		werr = f.Write(c.resultsDir)
	}
	if err := o.failures(fiveXX); err != nil {
		werr = errors.Join(werr, err)
	}
	return werr
}

// notes describe the run: the server, the load, what bench-serve and the
// server counted, the stop, and the memory samples.
func (o *outcome) notes(c *config) []string {
	rep, bc := o.rep, o.bc
	notes := []string{
		fmt.Sprintf("server: %s %s (loopback)", c.server, strings.Join(o.args, " ")),
		fmt.Sprintf("load: %s of %s, its 512-token blocks as 4-token ones, prompts cut to %d tokens, max_tokens %d, for %v; %s",
			rep.Load, bc.Trace, bc.MaxPromptTokens, bc.MaxTokens, c.duration, "requests still in flight at the end are cancelled (counted apart)"),
		fmt.Sprintf("bench-serve: %d sent, %d completed, %d cancelled at the end, errors %v; served %.2f req/s against %.2f req/s offered",
			rep.Sent, rep.Completed, rep.Cancelled, rep.Errors, rep.RequestsPerSecond, float64(rep.Sent)/rep.WallSeconds),
		fmt.Sprintf("server's kvserve_requests_total by code: %v", o.codes),
		fmt.Sprintf("/metrics parsed as Prometheus text (expfmt.TextParser) before and after the load: %d and %d families", len(o.before), len(o.after)),
		fmt.Sprintf("SIGTERM after the load: exit %v, last log line says stopped cleanly: %v; WARN/ERROR log lines: %d", o.exitErr, o.clean, o.warnings),
	}
	var rssLine []string
	for _, s := range o.samples {
		rssLine = append(rssLine, fmt.Sprintf("%v %.1f/%.1f MiB %.0f", s.at.Round(time.Second), s.rss/(1<<20), s.heap/(1<<20), s.goroutines))
	}
	return append(notes, "during the load, at each time: resident memory/Go heap in use, goroutines: "+strings.Join(rssLine, ", "))
}

// fiveXX counts the 5xx answers, as bench-serve and the server counted
// them.
func (o *outcome) fiveXX() int {
	n := 0
	for code, v := range o.rep.Errors {
		if strings.HasPrefix(code, "5") {
			n += v
		}
	}
	for code, v := range o.codes {
		if strings.HasPrefix(code, "5") {
			n += int(v)
		}
	}
	return n
}

// addRows adds the run's figures to f.
func (o *outcome) addRows(f *results.File, fiveXX int) {
	rep, samples := o.rep, o.samples
	rss0 := gauge(o.before, "process_resident_memory_bytes")
	rss1 := gauge(o.after, "process_resident_memory_bytes")
	f.Add("requests sent", "requests", []float64{float64(rep.Sent)}, "")
	f.Add("requests completed", "requests", []float64{float64(rep.Completed)}, "")
	f.Add("429 answers (queue full)", "requests", []float64{float64(rep.Errors["429"])}, "")
	f.Add("5xx answers", "requests", []float64{float64(fiveXX)}, "")
	f.Add("other errors (transport, timeout, stream)", "requests", []float64{float64(otherErrors(rep.Errors))}, "")
	f.Add("offered rate", "req/s", []float64{float64(rep.Sent) / rep.WallSeconds}, "")
	f.Add("served rate (completed)", "req/s", []float64{rep.RequestsPerSecond}, "offered rate")
	f.Add("TTFT p50 of completed requests", "s", []float64{rep.TTFT.P50}, "")
	f.Add("TTFT p90 of completed requests", "s", []float64{rep.TTFT.P90}, "")
	f.Add("resident memory before the load", "MiB", []float64{rss0 / (1 << 20)}, "")
	if len(samples) > 0 {
		f.Add("resident memory at the first sample in the load", "MiB", []float64{samples[0].rss / (1 << 20)}, "")
	}
	f.Add("resident memory at the end of the load", "MiB", []float64{rss1 / (1 << 20)}, "")
	if len(samples) > 0 {
		f.Add("Go heap in use at the first sample in the load", "MiB", []float64{samples[0].heap / (1 << 20)}, "")
		f.Add("Go heap in use at the last sample in the load", "MiB", []float64{samples[len(samples)-1].heap / (1 << 20)}, "")
	}
}

// failures is the requirements the run did not meet, or nil.
func (o *outcome) failures(fiveXX int) error {
	var failed []string
	if fiveXX > 0 {
		failed = append(failed, fmt.Sprintf("%d 5xx answers", fiveXX))
	}
	if o.rep.Errors["429"] == 0 {
		failed = append(failed, "no 429: the rate was not above capacity")
	}
	if o.exitErr != nil || !o.clean {
		failed = append(failed, fmt.Sprintf("the server did not stop cleanly (%v)", o.exitErr))
	}
	if len(failed) == 0 {
		return nil
	}
	return errors.New(strings.Join(failed, "; "))
}
