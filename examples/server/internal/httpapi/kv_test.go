package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/policy"
)

// kvManager is a one-tier (GPU) manager of 64 blocks of 4 tokens, with an
// event ring of events (0: none).
func kvManager(t *testing.T, events int) *kvtier.Manager {
	t.Helper()
	p, err := policy.NewDenseLRU[kvtier.BlockRef](64)
	if err != nil {
		t.Fatal(err)
	}
	cfg := kvtier.Config{BlockTokens: 4, EventBuffer: events}
	cfg.Tiers[kvtier.GPU] = kvtier.TierConfig{CapacityBytes: 64 << 10, SlotBytes: 1 << 10, Policy: p}
	m, err := kvtier.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// cache inserts tokens' full blocks under the salt of user, ready.
func cache(t *testing.T, m *kvtier.Manager, user string, tokens []int32) {
	t.Helper()
	var l kvtier.Lease
	if err := m.Insert(kvtier.Salt(openai.SaltOf(user, "")), tokens, kvtier.GPU, &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(&l, nil); err != nil {
		t.Fatal(err)
	}
	m.Release(&l)
}

func postKV(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url+KVPath+"lookup", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestKVLookup(t *testing.T) {
	m := kvManager(t, 0)
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	cache(t, m, "alice", prompt[:8])
	_, srv := newTestServer(t, newTestBackend(), Config{KV: &KV{Manager: m, LookupTokens: func(n int) int { return (n - 1) / 4 * 4 }}})
	before := m.Metrics()
	for _, tc := range []struct {
		body                 string
		lookedUp, cached     int
		gpuCached, gpuPrefix int
	}{
		{`{"prompt": [1,2,3,4,5,6,7,8,9,10], "user": "alice"}`, 8, 8, 8, 8},
		{`{"prompt": [1,2,3,4,5,6,7,8,9], "user": "alice"}`, 8, 8, 8, 8},
		{`{"prompt": [1,2,3,4,5,6,7,8], "user": "alice"}`, 4, 4, 4, 4}, // the last position's block is computed
		{`{"prompt": [1,2,3,4,5,6,7,8,9,10]}`, 8, 0, 0, 0},             // another tenant
		{`{"prompt": [1,2,3,5,5,6,7,8,9,10], "user": "alice"}`, 8, 0, 0, 0},
		{`{"prompt": "\u0001\u0002\u0003\u0004\u0005\u0006\u0007\u0008\t", "user": "alice"}`, 8, 8, 8, 8},
	} {
		code, body := postKV(t, srv.URL, tc.body)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.body, code, body)
		}
		var r KVLookupResponse
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		g, ok := r.Tiers["gpu"]
		if !ok || len(r.Tiers) != 1 || r.LookedUpTokens != tc.lookedUp || r.CachedTokens != tc.cached ||
			g.CachedTokens != tc.gpuCached || g.PrefixTokens != tc.gpuPrefix || r.TookMicros <= 0 {
			t.Errorf("%s: %s", tc.body, body)
		}
	}
	if after := m.Metrics(); after != before {
		t.Errorf("the lookups changed the manager's counters:\n%+v\n%+v", before, after)
	}
}

func TestKVLookupBadInput(t *testing.T) {
	m := kvManager(t, 0)
	_, srv := newTestServer(t, newTestBackend(), Config{KV: &KV{Manager: m}, MaxBodyBytes: 1 << 10})
	for _, tc := range []struct {
		body  string
		code  int
		param string
	}{
		{``, 400, "body"},
		{`{"prompt": [1, 2]} {}`, 400, "body"},
		{`{"prompt": []}`, 400, "prompt"},
		{`{}`, 400, "prompt"},
		{`{"prompt": [1, 512]}`, 400, "prompt"},                          // outside the vocabulary of 512
		{`{"prompt": [1, -1]}`, 400, "prompt"},                           // not a token id
		{`{"prompt": [[1, 2]]}`, 400, "prompt"},                          // a batch
		{`{"prompt": [1], "tenant": "x"}`, 400, "body"},                  // an unknown field
		{`{"prompt": [1], "user": 7}`, 400, "user"},                      // a wrong type
		{`{"prompt": "` + strings.Repeat("a", 65) + `"}`, 400, "prompt"}, // past the context of 64
		{`{"prompt": "` + strings.Repeat("a", 2000) + `"}`, 413, "body"},
	} {
		code, body := postKV(t, srv.URL, tc.body)
		var e openai.ErrorResponse
		if err := json.Unmarshal(body, &e); err != nil {
			t.Fatalf("%.40s: %d %s", tc.body, code, body)
		}
		if code != tc.code || e.Error.Param == nil || *e.Error.Param != tc.param || e.Error.Message == "" {
			t.Errorf("%.40s: %d %s; want %d naming %s", tc.body, code, body, tc.code, tc.param)
		}
	}
	// Without Config.KV there are no such routes.
	_, plain := newTestServer(t, newTestBackend(), Config{})
	if code, _ := postKV(t, plain.URL, `{"prompt": [1]}`); code != http.StatusNotFound {
		t.Errorf("lookup without Config.KV: %d", code)
	}
	if _, err := New(Config{Backend: newTestBackend(), KV: &KV{}}); err == nil || !strings.Contains(err.Error(), "KV.Manager") {
		t.Errorf("New with a KV but no manager: %v", err)
	}
}

// sseReader reads server-sent events.
type sseReader struct {
	t    *testing.T
	resp *http.Response
	sc   *bufio.Scanner
}

func openEvents(t *testing.T, url, query string, header http.Header) (*sseReader, int) {
	t.Helper()
	req, err := http.NewRequest("GET", url+KVPath+"events"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, resp.StatusCode
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &sseReader{t: t, resp: resp, sc: bufio.NewScanner(resp.Body)}, resp.StatusCode
}

// next returns the next event's name, id and data ("" at the end).
func (r *sseReader) next() (name string, id uint64, data string) {
	for r.sc.Scan() {
		line := r.sc.Text()
		switch {
		case line == "" && name != "":
			return name, id, data
		case strings.HasPrefix(line, "event: "):
			name = line[len("event: "):]
		case strings.HasPrefix(line, "id: "):
			id, _ = strconv.ParseUint(line[len("id: "):], 10, 64)
		case strings.HasPrefix(line, "data: "):
			data = line[len("data: "):]
		}
	}
	return "", 0, ""
}

func (r *sseReader) event() KVEvent {
	r.t.Helper()
	name, id, data := r.next()
	var ev KVEvent
	if err := json.Unmarshal([]byte(data), &ev); err != nil {
		r.t.Fatalf("event %q id %d: %q: %v", name, id, data, err)
	}
	if ev.Kind != name || ev.Seq != id {
		r.t.Fatalf("event %q id %d carries %+v", name, id, ev)
	}
	return ev
}

func TestKVEvents(t *testing.T) {
	m := kvManager(t, 64)
	a, srv := newTestServer(t, newTestBackend(), Config{KV: &KV{Manager: m}})
	r, code := openEvents(t, srv.URL, "?from=1", nil)
	if code != http.StatusOK {
		t.Fatalf("GET events: %d", code)
	}
	if ev := r.event(); ev.Kind != "TierCleared" || ev.Tier != "gpu" || ev.Seq != 1 || ev.Key != "" {
		t.Fatalf("first event %+v", ev)
	}
	cache(t, m, "bob", []int32{1, 2, 3, 4, 5, 6, 7, 8})
	first, second := r.event(), r.event()
	salt := "0x" + strconv.FormatUint(openai.SaltOf("bob", ""), 16)
	if first.Kind != "BlockStored" || first.Seq != 2 || first.Salt != salt || first.Parent != "0x0" ||
		second.Parent != first.Key || second.FirstToken != 4 || second.NumTokens != 4 ||
		len(second.TokenIDs) != 4 || second.TokenIDs[3] != 8 {
		t.Fatalf("the insert's events: %+v %+v", first, second)
	}
	// A client that reconnects after event 2 gets 3 on.
	again, _ := openEvents(t, srv.URL, "", http.Header{"Last-Event-Id": {"2"}})
	if ev := again.event(); ev.Seq != 3 || ev.Key != second.Key {
		t.Fatalf("after Last-Event-ID 2: %+v", ev)
	}
	// Drain ends the streams.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if name, _, _ := r.next(); name != "" {
		t.Fatalf("after Drain the stream went on with %q", name)
	}
}

func TestKVEventsLostAndBadInput(t *testing.T) {
	m := kvManager(t, 4)
	_, srv := newTestServer(t, newTestBackend(), Config{KV: &KV{Manager: m}})
	for i := range 4 {
		cache(t, m, "carol", []int32{int32(i), 1, 2, 3, 4, 5, 6, 7}) // 2 events each
	}
	r, _ := openEvents(t, srv.URL, "?from=1", nil) // events 1 to 5 are gone
	name, _, data := r.next()
	if name != "lost" || data != `{"lost":5}` {
		t.Fatalf("a stream from an event gone: %q %s", name, data)
	}
	if ev := r.event(); ev.Seq != 6 {
		t.Fatalf("the first event after the gap: %+v", ev)
	}
	for _, q := range []string{"?from=x", "?from=-1", "?from=100"} {
		if _, code := openEvents(t, srv.URL, q, nil); code != http.StatusBadRequest {
			t.Errorf("%s: %d", q, code)
		}
	}
	if _, code := openEvents(t, srv.URL, "", http.Header{"Last-Event-Id": {"x"}}); code != http.StatusBadRequest {
		t.Errorf("Last-Event-ID x: %d", code)
	}
	_, off := newTestServer(t, newTestBackend(), Config{KV: &KV{Manager: kvManager(t, 0)}})
	if _, code := openEvents(t, off.URL, "", nil); code != http.StatusNotFound {
		t.Errorf("events with the stream off: %d", code)
	}
}
