package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"

	"kvtier.dev/internal/benchserve"
)

const metricsText = `# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 5.24288e+07
# TYPE kvserve_requests_total counter
kvserve_requests_total{code="200"} 7
kvserve_requests_total{code="429"} 3
kvserve_requests_total{code="500"} 0
`

// TestScrape: /metrics is read through the Prometheus text parser, its
// gauges and labelled counters read back; text that is not Prometheus
// text, and a status other than 200, are errors.
func TestScrape(t *testing.T) {
	body, status := metricsText, http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}))
	defer srv.Close()

	fams, err := scrape(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if got := gauge(fams, "process_resident_memory_bytes"); got != 50<<20 {
		t.Errorf("resident memory %g, want %d", got, 50<<20)
	}
	if got := gauge(fams, "absent"); got != 0 {
		t.Errorf("an absent gauge reads %g, want 0", got)
	}
	codes := counterByLabel(fams, "kvserve_requests_total", "code")
	if codes["200"] != 7 || codes["429"] != 3 || codes["500"] != 0 || len(codes) != 3 {
		t.Errorf("requests by code %v", codes)
	}

	body = "kvserve_requests_total{code=\"200\" 7\n"
	if _, err := scrape(srv.URL); err == nil {
		t.Error("malformed metrics text parsed")
	}
	body, status = metricsText, http.StatusServiceUnavailable
	if _, err := scrape(srv.URL); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("a 503 from /metrics: %v", err)
	}
}

func TestOtherErrors(t *testing.T) {
	if got := otherErrors(map[string]int{"429": 5, "500": 1, "503": 2, "transport": 3, "timeout": 1}); got != 4 {
		t.Errorf("otherErrors = %d, want 4 (transport and timeout, not 429 or 5xx)", got)
	}
}

// TestRunBadServer: a server binary that does not exist is an error that
// names the flag.
func TestRunBadServer(t *testing.T) {
	c := config{server: t.TempDir() + "/no-such-server"}
	if err := run(&c); err == nil || !strings.Contains(err.Error(), "-server") {
		t.Errorf("run with a missing server binary: %v", err)
	}
}

// TestRunServerExits: a server that exits before it answers /healthz is
// an error that says so.
func TestRunServerExits(t *testing.T) {
	bin, err := exec.LookPath("false")
	if err != nil {
		t.Skip("no false(1) on this machine")
	}
	c := config{server: bin}
	if err := run(&c); err == nil || !strings.Contains(err.Error(), "exited before answering /healthz") {
		t.Errorf("run with a server that exits at once: %v", err)
	}
}

// TestFailures: a run fails on a 5xx (counted by bench-serve and by the
// server), on no 429, and on a server that did not stop cleanly, each
// named; a run that meets all three does not.
func TestFailures(t *testing.T) {
	ok := outcome{rep: &benchserve.Report{Errors: map[string]int{"429": 3}}, codes: map[string]float64{"200": 7, "500": 0}, clean: true}
	if n := ok.fiveXX(); n != 0 {
		t.Errorf("fiveXX = %d, want 0", n)
	}
	if err := ok.failures(ok.fiveXX()); err != nil {
		t.Errorf("a good run: %v", err)
	}
	bad := outcome{rep: &benchserve.Report{Errors: map[string]int{"503": 2}}, codes: map[string]float64{"500": 1}, exitErr: errors.New("exit status 1")}
	err := bad.failures(bad.fiveXX())
	for _, want := range []string{"3 5xx answers", "no 429", "did not stop cleanly (exit status 1)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a bad run: %v, want it to say %q", err, want)
		}
	}
}
