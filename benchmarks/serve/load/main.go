// Load holds the model server (examples/server, on the CPU backend) at a
// request rate above what it can serve for a fixed time, and records what
// issue 13 asks of it: no 5xx, the 429s counted, the resident memory at the
// start, during and at the end, /metrics parsed as Prometheus text
// (client_golang's expfmt parser) before and after, and a clean drain on
// SIGTERM. It writes benchmarks/results/serve-load-<machine>.{json,md}.
//
//	go build -o /tmp/kvserve ./examples/server
//	nice -n 10 go run ./benchmarks/serve/load -server /tmp/kvserve -duration 5m -results benchmarks/results
//
// The load is the bundled trace's chat workload (kvtier/trace's generator
// with its default settings, more requests) sent through kvtier
// bench-serve's library (internal/benchserve), its 512-token blocks made
// 4-token ones for the tiny model, at -speed times its arrival rate.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"kvtier.dev/internal/benchserve"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/trace"
)

func main() {
	log.SetFlags(0)
	var c config
	flag.StringVar(&c.server, "server", "", "the server binary (go build -o FILE ./examples/server); required")
	flag.StringVar(&c.serverFlags, "server-flags", "-device cpu -model tiny -context 1024 -gpu-kv 256KiB -host 1MiB -nvme 16MiB -max-queue 32 -max-batch 16",
		"the server's flags (its -addr is chosen here)")
	flag.DurationVar(&c.duration, "duration", 5*time.Minute, "how long to send")
	flag.Float64Var(&c.speed, "speed", 6, "the bundled trace's arrival rate times this")
	flag.IntVar(&c.requests, "requests", 15000, "requests in the generated trace (enough for -duration at -speed)")
	flag.DurationVar(&c.sample, "sample", 15*time.Second, "how often to read the server's resident memory")
	flag.StringVar(&c.resultsDir, "results", "", "write serve-load-<machine>.{json,md} here (empty: print the markdown)")
	flag.StringVar(&c.machine, "machine", "dev-2core", "machine name in the results")
	flag.StringVar(&c.commit, "commit", "", "the commit the server was built from (empty: this binary's, if its build recorded one)")
	flag.Parse()
	if c.server == "" {
		log.Fatal("load: -server is required")
	}
	if err := run(&c); err != nil {
		log.Fatalf("load: %v", err)
	}
}

type config struct {
	server, serverFlags string
	duration, sample    time.Duration
	speed               float64
	requests            int
	resultsDir, machine string
	commit              string
}

// rssSample is the server's resident memory, Go heap in use and
// goroutines at one time into the run.
type rssSample struct {
	at                    time.Duration
	rss, heap, goroutines float64
}

func run(c *config) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	url := "http://" + addr
	args := append([]string{"-addr", addr}, strings.Fields(c.serverFlags)...)
	cmd := exec.Command(c.server, args...)
	var logMu sync.Mutex
	var logLines []string
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("-server: %w", err)
	}
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logMu.Lock()
			logLines = append(logLines, sc.Text())
			logMu.Unlock()
		}
		exited <- cmd.Wait()
	}()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	}()
	if err := waitHealthy(url, exited); err != nil {
		return err
	}
	before, err := scrape(url)
	if err != nil {
		return fmt.Errorf("/metrics before the load: %w", err)
	}
	rss0 := gauge(before, "process_resident_memory_bytes")

	var samples []rssSample
	var sampleErr error
	start := time.Now()
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(c.sample)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
				fams, err := scrape(url)
				if err != nil {
					sampleErr = fmt.Errorf("/metrics at %v: %w", time.Since(start).Round(time.Second), err)
					return
				}
				samples = append(samples, rssSample{time.Since(start), gauge(fams, "process_resident_memory_bytes"),
					gauge(fams, "go_memstats_heap_inuse_bytes"), gauge(fams, "go_goroutines")})
			}
		}
	}()
	bc := benchserve.Config{URL: url, Speed: c.speed, Duration: c.duration, Timeout: 10 * time.Minute,
		Vocab: 256, BlockTokens: 4, MaxPromptTokens: 900, MaxTokens: 16}
	gen := trace.DefaultGenConfig()
	gen.Requests = c.requests
	var tr bytes.Buffer
	if err := trace.Generate(&tr, gen, trace.FormatMooncake); err != nil {
		return fmt.Errorf("generating the trace: %w", err)
	}
	bc.Trace = fmt.Sprintf("generated: the bundled trace's chat workload, %d requests", gen.Requests)
	bc.Format = trace.FormatMooncake
	bc.Open = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tr.Bytes())), nil }
	rep, err := benchserve.Run(context.Background(), bc)
	close(stopSampling)
	<-sampled
	if err != nil {
		return err
	}
	if sampleErr != nil {
		return sampleErr
	}
	after, err := scrape(url)
	if err != nil {
		return fmt.Errorf("/metrics after the load: %w", err)
	}
	rss1 := gauge(after, "process_resident_memory_bytes")
	codes := counterByLabel(after, "kvserve_requests_total", "code")

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	var exitErr error
	select {
	case exitErr = <-exited:
	case <-time.After(2 * time.Minute):
		exitErr = errors.New("the server did not exit within 2 minutes of SIGTERM")
	}
	logMu.Lock()
	clean := len(logLines) > 0 && strings.Contains(logLines[len(logLines)-1], "stopped cleanly")
	var warnings int
	for _, l := range logLines {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			warnings++
		}
	}
	logMu.Unlock()

	f := results.New("serve-load", c.machine, c.commit)
	f.Command = strings.Join(os.Args, " ")
	f.Notes = append(f.Notes,
		fmt.Sprintf("server: %s %s (loopback)", c.server, strings.Join(args, " ")),
		fmt.Sprintf("load: %s of %s, its 512-token blocks as 4-token ones, prompts cut to %d tokens, max_tokens %d, for %v; %s",
			rep.Load, bc.Trace, bc.MaxPromptTokens, bc.MaxTokens, c.duration, "requests still in flight at the end are cancelled (counted apart)"),
		fmt.Sprintf("bench-serve: %d sent, %d completed, %d cancelled at the end, errors %v; served %.2f req/s against %.2f req/s offered",
			rep.Sent, rep.Completed, rep.Cancelled, rep.Errors, rep.RequestsPerSecond, float64(rep.Sent)/rep.WallSeconds),
		fmt.Sprintf("server's kvserve_requests_total by code: %v", codes),
		fmt.Sprintf("/metrics parsed as Prometheus text (expfmt.TextParser) before and after the load: %d and %d families", len(before), len(after)),
		fmt.Sprintf("SIGTERM after the load: exit %v, last log line says stopped cleanly: %v; WARN/ERROR log lines: %d", exitErr, clean, warnings),
	)
	var rssLine []string
	for _, s := range samples {
		rssLine = append(rssLine, fmt.Sprintf("%v %.1f/%.1f MiB %.0f", s.at.Round(time.Second), s.rss/(1<<20), s.heap/(1<<20), s.goroutines))
	}
	f.Notes = append(f.Notes, "during the load, at each time: resident memory/Go heap in use, goroutines: "+strings.Join(rssLine, ", "))
	fiveXX := 0
	for code, n := range rep.Errors {
		if strings.HasPrefix(code, "5") {
			fiveXX += n
		}
	}
	for code, n := range codes {
		if strings.HasPrefix(code, "5") {
			fiveXX += int(n)
		}
	}
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

	var werr error
	if c.resultsDir == "" {
		werr = f.Markdown(os.Stdout)
	} else {
		werr = f.Write(c.resultsDir)
	}
	var failed []string
	if fiveXX > 0 {
		failed = append(failed, fmt.Sprintf("%d 5xx answers", fiveXX))
	}
	if rep.Errors["429"] == 0 {
		failed = append(failed, "no 429: the rate was not above capacity")
	}
	if exitErr != nil || !clean {
		failed = append(failed, fmt.Sprintf("the server did not stop cleanly (%v)", exitErr))
	}
	if len(failed) > 0 {
		werr = errors.Join(werr, errors.New(strings.Join(failed, "; ")))
	}
	return werr
}

// freeAddr is a loopback address with a port free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

func waitHealthy(url string, exited <-chan error) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("the server exited before answering /healthz: %v", err)
		default:
		}
		resp, err := http.Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("the server did not answer /healthz within 60s")
}

// scrape reads /metrics through Prometheus's text parser.
func scrape(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

func gauge(fams map[string]*dto.MetricFamily, name string) float64 {
	f := fams[name]
	if f == nil || len(f.GetMetric()) == 0 {
		return 0
	}
	return f.GetMetric()[0].GetGauge().GetValue()
}

func counterByLabel(fams map[string]*dto.MetricFamily, name, label string) map[string]float64 {
	out := map[string]float64{}
	f := fams[name]
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				out[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func otherErrors(errs map[string]int) int {
	n := 0
	for code, v := range errs {
		if code != "429" && !strings.HasPrefix(code, "5") {
			n += v
		}
	}
	return n
}
