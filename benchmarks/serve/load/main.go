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
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"kvtier.dev/internal/benchserve"
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

// run starts the server, holds it under load, stops it and writes what it
// measured; an unmet requirement (a 5xx, no 429, an unclean stop) is an
// error after the results are written.
func run(c *config) error {
	srv, err := startServer(c)
	if err != nil {
		return err
	}
	defer srv.kill()
	if err := waitHealthy(srv.url, srv.exited); err != nil {
		return err
	}
	o, err := measure(c, srv)
	if err != nil {
		return err
	}
	return o.write(c)
}

// outcome is what a run measured.
type outcome struct {
	args          []string // the server's
	bc            benchserve.Config
	rep           *benchserve.Report
	before, after map[string]*dto.MetricFamily
	samples       []rssSample
	codes         map[string]float64 // kvserve_requests_total by code, after the load
	exitErr       error              // the server's exit after SIGTERM
	clean         bool               // its last log line says it stopped cleanly
	warnings      int                // its WARN and ERROR log lines
}

// measure scrapes the server's /metrics, sends the load while sampling its
// memory, scrapes again and stops it.
func measure(c *config, srv *server) (*outcome, error) {
	o := &outcome{args: srv.args}
	var err error
	if o.before, err = scrape(srv.url); err != nil {
		return nil, fmt.Errorf("/metrics before the load: %w", err)
	}
	smp := startSampling(srv.url, c.sample)
	o.rep, o.bc, err = sendLoad(c, srv.url)
	samples, sampleErr := smp.stop()
	if err != nil {
		return nil, err
	}
	if sampleErr != nil {
		return nil, sampleErr
	}
	o.samples = samples
	if o.after, err = scrape(srv.url); err != nil {
		return nil, fmt.Errorf("/metrics after the load: %w", err)
	}
	o.codes = counterByLabel(o.after, "kvserve_requests_total", "code")
	if o.exitErr, err = srv.stop(); err != nil {
		return nil, err
	}
	o.clean, o.warnings = srv.logSummary()
	return o, nil
}

// sendLoad sends the bundled trace's chat workload (c.requests of it) to
// url through bench-serve's library, at c.speed for c.duration.
func sendLoad(c *config, url string) (*benchserve.Report, benchserve.Config, error) {
	bc := benchserve.Config{URL: url, Speed: c.speed, Duration: c.duration, Timeout: 10 * time.Minute,
		Vocab: 256, BlockTokens: 4, MaxPromptTokens: 900, MaxTokens: 16}
	gen := trace.DefaultGenConfig()
	gen.Requests = c.requests
	var tr bytes.Buffer
	if err := trace.Generate(&tr, gen, trace.FormatMooncake); err != nil {
		return nil, bc, fmt.Errorf("generating the trace: %w", err)
	}
	bc.Trace = fmt.Sprintf("generated: the bundled trace's chat workload, %d requests", gen.Requests)
	bc.Format = trace.FormatMooncake
	bc.Open = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tr.Bytes())), nil }
	rep, err := benchserve.Run(context.Background(), bc)
	return rep, bc, err
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
