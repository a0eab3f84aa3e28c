package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvtier.dev/internal/openai"
)

// idBody is a request body of a prompt of n token ids ("1,1,1,..."),
// produced as it is read so that the client holds none of it.
type idBody struct {
	head, tail string
	n          int64 // ids left
	off        int   // into head, then tail
	state      int   // 0 head, 1 ids, 2 tail, 3 done
}

func newIDBody(n int64) *idBody {
	return &idBody{head: `{"max_tokens":1,"prompt":[1`, tail: `]}`, n: n - 1}
}

// bodyBytes is the length of newIDBody(n).
func bodyBytes(n int64) int64 { return int64(len(`{"max_tokens":1,"prompt":[1`)+len(`]}`)) + 2*(n-1) }

func (b *idBody) Read(p []byte) (int, error) {
	k := 0
	for k < len(p) {
		switch b.state {
		case 0, 2:
			s := b.head
			if b.state == 2 {
				s = b.tail
			}
			c := copy(p[k:], s[b.off:])
			k += c
			if b.off += c; b.off == len(s) {
				b.state++
				b.off = 0
			}
		case 1:
			for k+1 < len(p) && b.n > 0 {
				p[k], p[k+1] = ',', '1'
				k += 2
				b.n--
			}
			if b.n == 0 {
				b.state = 2
			} else if k+1 >= len(p) {
				return k, nil
			}
		default:
			if k == 0 {
				return 0, io.EOF
			}
			return k, nil
		}
	}
	return k, nil
}

// send posts body (with a Content-Length when sized) and returns the
// status, or 0 if no response came.
func send(url string, body io.Reader, size int64) int {
	req, err := http.NewRequest("POST", url+openai.CompletionsPath, body)
	if err != nil {
		return 0
	}
	req.ContentLength = size
	if size == 0 {
		req.ContentLength = -1 // chunked
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestBodyCapFromContext: with no MaxBodyBytes the cap follows the model's
// context (17 KiB at 64 tokens), so a body the size the old fixed 16 MiB
// cap allowed is refused unread (413), sized or chunked; a pretty-printed
// prompt of the whole context still fits.
func TestBodyCapFromContext(t *testing.T) {
	_, srv := newTestServer(t, newTestBackend(), Config{})
	const ids = 100 << 10 // 200 KiB of ids, far over 64 tokens
	if got := send(srv.URL, newIDBody(ids), bodyBytes(ids)); got != http.StatusRequestEntityTooLarge {
		t.Errorf("sized body of %d bytes: status %d, want 413", bodyBytes(ids), got)
	}
	if got := send(srv.URL, newIDBody(ids), 0); got != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked body of %d bytes: status %d, want 413", bodyBytes(ids), got)
	}
	pretty, _ := json.MarshalIndent(map[string]any{"prompt": make([]int, 63), "max_tokens": 1, "model": "test-model"}, "", "        ")
	if resp, body := post(t, srv.URL, string(pretty)); resp.StatusCode != 200 {
		t.Errorf("a pretty-printed prompt of 63 ids (%d bytes): status %d: %s", len(pretty), resp.StatusCode, body)
	}
}

// TestOversizedBodiesAllocate: four 16 MiB bodies of ids at once, sized
// or chunked, are refused at a cost in allocated bytes of a few times the
// body cap each (the fixed 16 MiB cap read each whole and made a
// json.RawMessage per id: about 730 MB). An operator's cap raised to 16
// MiB still reads no id past the context: the body's bytes, and little
// more.
func TestOversizedBodiesAllocate(t *testing.T) {
	const ids = 8 << 20 // 16 MiB
	perRequest := func(t *testing.T, url string, clients int, sized bool) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		var wg sync.WaitGroup
		codes := make([]int, clients)
		for i := range clients {
			wg.Go(func() {
				size := int64(0)
				if sized {
					size = bodyBytes(ids)
				}
				codes[i] = send(url, newIDBody(ids), size)
			})
		}
		wg.Wait()
		runtime.ReadMemStats(&after)
		for i, c := range codes {
			if c != http.StatusRequestEntityTooLarge && c != http.StatusBadRequest {
				t.Fatalf("client %d: status %d, want 400 or 413", i, c)
			}
		}
		return (after.TotalAlloc - before.TotalAlloc) / uint64(clients)
	}
	_, srv := newTestServer(t, newTestBackend(), Config{})
	for _, sized := range []bool{true, false} {
		got := perRequest(t, srv.URL, 4, sized)
		t.Logf("sized %v: %d bytes allocated per request", sized, got)
		if got > 1<<20 {
			t.Errorf("sized %v: %d bytes allocated per request, want under 1 MiB (the cap is %d)", sized, got, bodyCap(newTestBackend().lim))
		}
	}
	_, big := newTestServer(t, newTestBackend(), Config{MaxBodyBytes: 16<<20 + 64})
	got := perRequest(t, big.URL, 1, true)
	t.Logf("a 16 MiB cap: %d bytes allocated for a 16 MiB body", got)
	if got > 24<<20 {
		t.Errorf("a 16 MiB cap: %d bytes allocated for a 16 MiB body, want under 24 MiB", got)
	}
}

// TestEchoedFieldsClipped: an error quotes at most a few dozen bytes of a
// field the client sent, and says how long it was.
func TestEchoedFieldsClipped(t *testing.T) {
	_, srv := newTestServer(t, newTestBackend(), Config{MaxBodyBytes: 8 << 20})
	huge := strings.Repeat("m", 3_000_000)
	for _, c := range []struct{ body, param string }{
		{`{"prompt":"x","model":"` + huge + `"}`, "model"},
		{`{"prompt":"x","max_tokens":1` + strings.Repeat("0", 3_000_000) + `}`, "max_tokens"},
		{`{"prompt":[1,` + strings.Repeat("7", 3_000_000) + `]}`, "prompt"},
	} {
		resp, body := post(t, srv.URL, c.body)
		if resp.StatusCode != 400 || len(body) > 512 || !strings.Contains(string(body), "3000") || !strings.Contains(string(body), `"param":"`+c.param+`"`) {
			t.Errorf("%.40s...: status %d, %d bytes: %.300s", c.body, resp.StatusCode, len(body), body)
		}
	}
}

// TestHalfClosedClientAborted: a client that sends its request and shuts
// its side of the connection gets no answer (the connection is aborted),
// not an empty 200 OK, streamed or not.
func TestHalfClosedClientAborted(t *testing.T) {
	b := newTestBackend()
	b.gate = make(chan struct{}) // never opened: requests end on their context
	a, srv := newTestServer(t, b, Config{})
	for _, stream := range []string{"false", "true"} {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		body := `{"prompt":"hi","stream":` + stream + `}`
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		c.(*net.TCPConn).CloseWrite()
		got, _ := io.ReadAll(c) // EOF or a reset
		c.Close()
		if len(got) != 0 {
			t.Errorf("stream %s: a half-closed client read %q, want nothing", stream, got)
		}
	}
	if err := a.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, scrape(t, srv.URL), "kvserve_requests_total", "code", "canceled"); got != 2 {
		t.Errorf("%g requests counted canceled, want 2", got)
	}
}

// partialRequest writes the headers of a completion request of a body of
// size bytes and the first part of the body, and leaves the rest unsent.
func partialRequest(t *testing.T, c net.Conn, size int, part string) {
	if _, err := fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", size, part); err != nil {
		t.Error(err)
	}
}

// TestDecodeTurnsBounded: with MaxDecodes 1, a second request's body is not
// read while a slow client holds the turn, and is once the first body is
// in; both are answered.
func TestDecodeTurnsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, err := New(Config{Backend: newTestBackend(), MaxDecodes: 1})
		if err != nil {
			t.Fatal(err)
		}
		l, _ := servePipes(t, a)
		body := `{"prompt":"slow","max_tokens":1}`
		slow := l.dial()
		go partialRequest(t, slow, len(body), body[:5])
		synctest.Wait()
		second := l.dial()
		partialRequest(t, second, len(body), "") // the headers alone: the server reads them before its handler
		var sent sync.WaitGroup
		sent.Go(func() { io.WriteString(second, body) }) // returns once the handler reads the body
		synctest.Wait()
		if got := testutil.ToFloat64(a.m.decoding); got != 1 {
			t.Fatalf("%g requests decoding, want 1", got)
		}
		if !blocked(&sent) {
			t.Fatal("the second body was read while the first held the only decode turn")
		}
		go io.WriteString(slow, body[5:])
		for _, c := range []net.Conn{slow, second} {
			resp, err := readResponse(t, c)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("%v, %v", resp, err)
			}
		}
		sent.Wait()
	})
}

// blocked reports whether wg's goroutines are all still running, once the
// bubble is idle.
func blocked(wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	synctest.Wait()
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// TestBodyTimeout: a body not in within BodyTimeout gets 408 and the
// connection closes.
func TestBodyTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, err := New(Config{Backend: newTestBackend(), BodyTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		l, _ := servePipes(t, a)
		c := l.dial()
		go partialRequest(t, c, 100, `{"prompt":`)
		start := time.Now()
		resp, err := readResponse(t, c)
		if err != nil || resp.StatusCode != http.StatusRequestTimeout || !resp.Close {
			t.Fatalf("%+v, %v; want 408 and the connection closed", resp, err)
		}
		if waited := time.Since(start); waited != 5*time.Second {
			t.Errorf("answered after %v of the bubble's clock, want the 5s body timeout", waited)
		}
	})
}

// TestDrainEndsBodyReads: a request whose body is still coming is not in
// flight: Drain returns at once, and the slow client gets 503.
func TestDrainEndsBodyReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, err := New(Config{Backend: newTestBackend()})
		if err != nil {
			t.Fatal(err)
		}
		l, _ := servePipes(t, a)
		c := l.dial()
		go partialRequest(t, c, 100, `{"prompt":`)
		synctest.Wait()
		if got := testutil.ToFloat64(a.m.decoding); got != 1 {
			t.Fatalf("%g requests decoding, want 1", got)
		}
		start := time.Now()
		if err := a.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		resp, err := readResponse(t, c)
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%+v, %v; want 503", resp, err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("drained after %v of the bubble's clock, want at once", waited)
		}
	})
}

// TestWriteTimeout: a client that reads none of its answer is cut off
// after WriteTimeout, so that neither Drain nor the server's Shutdown
// waits for it (they did until the drain timeout).
func TestWriteTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newTestBackend()
		a, err := New(Config{Backend: b, WriteTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		l, srv := servePipes(t, a)
		for _, stream := range []string{"false", "true"} {
			c := l.dial()
			defer c.Close()
			body := `{"prompt":"x","max_tokens":8,"stream":` + stream + `}`
			partialRequest(t, c, len(body), body) // and never read
			synctest.Wait()
			if got := testutil.ToFloat64(a.m.inFlight); got != 1 {
				t.Fatalf("stream %s: %g in flight, want 1 (its answer unread)", stream, got)
			}
			time.Sleep(6 * time.Second)
			synctest.Wait()
			if got := testutil.ToFloat64(a.m.inFlight); got != 0 {
				t.Fatalf("stream %s: %g in flight after the write timeout, want 0", stream, got)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour) // the bubble's hour
		defer cancel()
		if err := a.Drain(ctx); err != nil {
			t.Fatal(err)
		}
		if err := srv.Shutdown(ctx); err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	})
}
