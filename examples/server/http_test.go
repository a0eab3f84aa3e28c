package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kvtier.dev/internal/openai"
)

func TestHTTPArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-header-timeout", "0s"}, "-header-timeout must be positive"},
		{[]string{"-body-timeout", "-1s"}, "-body-timeout must be positive"},
		{[]string{"-write-timeout", "0s"}, "-write-timeout must be positive"},
		{[]string{"-idle-timeout", "0s"}, "-idle-timeout must be positive"},
		{[]string{"-max-conns", "-1"}, "-max-conns -1 is negative"},
	} {
		if _, err := parseArgs(tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error with %q", tc.args, err, tc.want)
		}
	}
	limit, ok := openFileLimit()
	if !ok {
		t.Skip("no open-file limit here")
	}
	over := strconv.FormatUint(limit, 10)
	if _, err := parseArgs([]string{"-max-conns", over}, io.Discard); err == nil || !strings.Contains(err.Error(), "open-file limit") {
		t.Errorf("-max-conns %s with a limit of %d: %v", over, limit, err)
	}
	c, err := parseArgs(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if n := c.http.connLimit(); n < 1 || n > 1024 || uint64(n) > limit/2 && n > 1 {
		t.Errorf("default connection limit %d with an open-file limit of %d", n, limit)
	}
}

// metric reads one unlabelled series of /metrics.
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	if f := scrape(t, url)[name]; f != nil && f.Metric[0].Gauge != nil {
		return f.Metric[0].Gauge.GetValue()
	}
	return -1
}

// TestServeDrainWithSlowClients: slow clients do not hold the drain: one
// sending its body slowly (its read ends, 503), one sending its headers
// slowly, one idle on a keep-alive connection; shutdown is clean, well
// before -drain-timeout (it ran out, and run failed, when a body still
// coming counted as in flight).
func TestServeDrainWithSlowClients(t *testing.T) {
	s := start(t, testArgs("-drain-timeout", "10m")...)
	addr := strings.TrimPrefix(s.url, "http://")
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	body := dial()
	fmt.Fprintf(body, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
	headers := dial()
	fmt.Fprintf(headers, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
	idle := dial()
	fmt.Fprintf(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	idleReader := bufio.NewReader(idle)
	if resp, err := http.ReadResponse(idleReader, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz on the keep-alive connection: %v, %v", resp, err)
	}
	for deadline := time.Now().Add(30 * time.Second); metric(t, s.url, "kvserve_decoding_requests") != 1; {
		if time.Now().After(deadline) {
			t.Fatal("the slow body never reached the handler")
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	if err := s.shutdown(); err != nil {
		t.Fatalf("shutdown with slow clients: %v\n%s", err, s.logs)
	}
	t.Logf("shutdown took %v with three slow clients", time.Since(start))
	if !strings.Contains(s.logs.String(), "stopped cleanly") {
		t.Errorf("no clean stop in the log:\n%s", s.logs)
	}
	resp, err := http.ReadResponse(bufio.NewReader(body), nil)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("the slow body's client: %v, %v; want 503", resp, err)
	}
}

// vmKiB reads a VmRSS or VmHWM line of /proc/pid/status, in KiB.
func vmKiB(b *testing.B, pid int, field string) int64 {
	b.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Skip("no /proc here:", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatal(line, err)
			}
			return n
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// zeroIDs is a request of about size bytes, {"prompt":[0,0,...,0]}, a
// prompt of token ids produced as it is read.
type zeroIDs struct{ off, ids int64 }

const zeroIDsHead, zeroIDsTail = `{"prompt":[`, `0]}`

func newZeroIDs(size int64) *zeroIDs {
	return &zeroIDs{ids: (size - int64(len(zeroIDsHead)+len(zeroIDsTail))) / 2}
}

// len is the body's length in bytes.
func (z *zeroIDs) len() int64 { return int64(len(zeroIDsHead)) + 2*z.ids + int64(len(zeroIDsTail)) }

func (z *zeroIDs) Read(p []byte) (int, error) {
	n := int(min(int64(len(p)), z.len()-z.off))
	if n == 0 {
		return 0, io.EOF
	}
	head, tail := int64(len(zeroIDsHead)), z.len()-int64(len(zeroIDsTail))
	for i := range n {
		switch k := z.off + int64(i); {
		case k < head:
			p[i] = zeroIDsHead[k]
		case k >= tail:
			p[i] = zeroIDsTail[k-tail]
		default:
			p[i] = "0,"[(k-head)%2]
		}
	}
	z.off += int64(n)
	return n, nil
}

// BenchmarkServeOversizedBodies sends four 16 MiB requests of 8.4M token
// ids at once to a server in its own process (the tiny model at -context 1024),
// with a Content-Length or chunked, and reports the slowest answer's time
// (max-ms) and the server's resident memory above idle at its peak
// (rss-peak-MB, VmHWM after /proc/pid/clear_refs reset it).
func BenchmarkServeOversizedBodies(b *testing.B) {
	for _, sized := range []bool{true, false} {
		b.Run(map[bool]string{true: "sized", false: "chunked"}[sized], func(b *testing.B) {
			s := startChild(b, testArgs("-context", "1024")...)
			pid := s.cmd.Process.Pid
			idle := vmKiB(b, pid, "VmRSS")
			if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
				b.Skip("cannot reset the peak RSS:", err)
			}
			var slowest time.Duration
			for b.Loop() {
				var wg sync.WaitGroup
				var mu sync.Mutex
				for range 4 {
					wg.Go(func() {
						ids := newZeroIDs(16 << 20)
						req, _ := http.NewRequest("POST", s.url+openai.CompletionsPath, ids)
						req.ContentLength = -1
						if sized {
							req.ContentLength = ids.len()
						}
						start := time.Now()
						resp, err := http.DefaultTransport.RoundTrip(req)
						took := time.Since(start)
						if err != nil {
							b.Error(err)
							return
						}
						resp.Body.Close()
						if resp.StatusCode != 400 && resp.StatusCode != 413 {
							b.Errorf("status %d, want 400 or 413", resp.StatusCode)
						}
						mu.Lock()
						slowest = max(slowest, took)
						mu.Unlock()
					})
				}
				wg.Wait()
			}
			b.ReportMetric(float64(slowest.Microseconds())/1000, "max-ms")
			b.ReportMetric(float64(vmKiB(b, pid, "VmHWM")-idle)/1024, "rss-peak-MB")
		})
	}
}
