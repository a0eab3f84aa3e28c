package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvtier.dev/examples/server/internal/httpapi"
	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier"
)

const adminToken = "s3cret-operator-token"

// adminServer is a test server with the operator's API.
type adminServer struct {
	*server
	admin string // the operator's API's URL
	args  []string
}

// startAdminServer starts a test server with -admin-addr and a token file.
func startAdminServer(t *testing.T, extra ...string) *adminServer {
	t.Helper()
	args := testArgs(append([]string{"-admin-addr", "127.0.0.1:0", "-admin-token-file", writeSecret(t, "token", []byte(adminToken+"\n"))}, extra...)...)
	up := make(chan string, 1)
	s := startWith(t, func(c *config) { c.admin.up = func(addr string) { up <- addr } }, args...)
	return &adminServer{server: s, admin: "http://" + <-up, args: args}
}

// call sends an operator's call with token ("" for none) and returns the
// status and body.
func (s *adminServer) call(t *testing.T, token, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, s.admin+httpapi.AdminPath+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// ok makes a call with the right token that must answer want, and decodes
// its answer into out (if not nil).
func (s *adminServer) ok(t *testing.T, method, path string, body any, want int, out any) {
	t.Helper()
	status, b := s.call(t, adminToken, method, path, body)
	if status != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, status, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
}

func (s *adminServer) blocks(t *testing.T, path string, body any) int {
	t.Helper()
	var r httpapi.AdminBlocks
	s.ok(t, http.MethodPost, path, body, http.StatusOK, &r)
	return r.Blocks
}

func (s *adminServer) tiers(t *testing.T) httpapi.AdminTiers {
	t.Helper()
	var r httpapi.AdminTiers
	s.ok(t, http.MethodGet, "tiers", nil, http.StatusOK, &r)
	return r
}

// cached is the prompt's cached tokens in its next completion's usage.
func (s *adminServer) cached(t *testing.T, p openai.Prompt, user string) openai.TierTokens {
	t.Helper()
	res := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(1), User: user})
	d := res.Usage.PromptTokensDetails
	if d == nil || d.CachedTokensByTier == nil {
		t.Fatalf("usage without cached tokens by tier: %+v", res.Usage)
	}
	return *d.CachedTokensByTier
}

// TestAdminToken: a call without the bearer token or with a wrong one gets
// 401 with a JSON error and is logged; the right token is served; the
// completions' address serves no admin route.
func TestAdminToken(t *testing.T) {
	s := startAdminServer(t)
	for _, tc := range []struct{ name, header string }{
		{"missing", ""}, {"wrong", "Bearer not-the-token"}, {"prefix of it", "Bearer " + adminToken[:5]},
		{"longer", "Bearer " + adminToken + "x"}, {"not bearer", "Basic " + adminToken}, {"empty bearer", "Bearer "},
	} {
		req, _ := http.NewRequest(http.MethodPost, s.admin+httpapi.AdminPath+"invalidate-tenant", strings.NewReader(`{}`))
		if tc.header != "" {
			req.Header.Set("Authorization", tc.header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e openai.ErrorResponse
		if resp.StatusCode != http.StatusUnauthorized || json.Unmarshal(b, &e) != nil || e.Error.Message == "" || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s token: %d %s, want 401 with a JSON error and WWW-Authenticate", tc.name, resp.StatusCode, b)
		}
	}
	if got := strings.Count(s.logs.String(), "admin: refused"); got != 6 {
		t.Errorf("%d refusals logged, want 6:\n%s", got, s.logs)
	}
	if st := s.tiers(t); len(st.Tiers) != 3 || st.Tiers["gpu"].CapacitySlots != 32 {
		t.Errorf("tiers with the right token: %+v, want gpu, host and nvme, 32 GPU slots", st)
	}
	if !strings.Contains(s.logs.String(), "path="+httpapi.AdminPath+"tiers status=200") {
		t.Errorf("the accepted call is not logged:\n%s", s.logs)
	}
	resp, err := http.Get(s.url + httpapi.AdminPath + "tiers")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the completions' address answers %s with %d, want 404", httpapi.AdminPath, resp.StatusCode)
	}
}

// TestAdminInvalidate: a prompt served, then invalidated by its text or
// ids, or by its block keys: the next completion of it reports no cached
// token, while another prompt's blocks stay.
func TestAdminInvalidate(t *testing.T) {
	s := startAdminServer(t) // a GPU tier of 32 blocks of 4 tokens: all 20 blocks stay there
	a, b, other := tokenPrompt(1, 21), tokenPrompt(2, 21), tokenPrompt(3, 21)
	text := openai.TextPrompt("kvtier operator test!") // 21 byte tokens
	for _, p := range []openai.Prompt{a, b, other, text} {
		s.cached(t, p, "")
	}
	before := s.tiers(t)
	if n := s.blocks(t, "invalidate", httpapi.AdminPrefix{Prompt: &a}); n != 5 {
		t.Errorf("invalidate a's 21 tokens: %d blocks, want its 5 full ones", n)
	}
	if n := s.blocks(t, "invalidate", map[string]any{"prompt": text.Text}); n != 5 {
		t.Errorf("invalidate the text prompt: %d blocks, want its 5 full ones", n)
	}
	hasher, _ := kvtier.NewHasher(4)
	var keys []string
	for _, k := range hasher.AppendKeys(nil, cacheSalt(t, s.args, 0), 0, b.Tokens[:20]) {
		keys = append(keys, "0x"+strconv.FormatUint(uint64(k), 16))
	}
	if n := s.blocks(t, "invalidate", httpapi.AdminPrefix{Keys: keys}); n != 5 {
		t.Errorf("invalidate b's 5 keys: %d blocks", n)
	}
	after := s.tiers(t)
	if after.Invalidations-before.Invalidations != 15 || after.Tiers["gpu"].ResidentBlocks != before.Tiers["gpu"].ResidentBlocks-15 {
		t.Errorf("state before %+v, after %+v: want 15 invalidations and 15 fewer GPU blocks", before, after)
	}
	for name, p := range map[string]openai.Prompt{"a": a, "b": b, "text": text} {
		if c := s.cached(t, p, ""); c.Sum() != 0 {
			t.Errorf("%s after its invalidation: %+v cached, want none", name, c)
		}
	}
	if c := s.cached(t, other, ""); c.GPU != 20 {
		t.Errorf("the prompt left alone: %+v cached, want its 20 tokens in GPU memory", c)
	}
	if !strings.Contains(s.logs.String(), "path="+httpapi.AdminPath+"invalidate status=200") || !strings.Contains(s.logs.String(), "blocks=5") {
		t.Errorf("the calls are not logged with their result:\n%s", s.logs)
	}
}

// TestAdminEvict: a prompt evicted to the host tier is served from there
// next (none from GPU memory); the tiers' state shows it left the GPU.
func TestAdminEvict(t *testing.T) {
	s := startAdminServer(t)
	a := tokenPrompt(1, 41)
	s.cached(t, a, "")
	if c := s.cached(t, a, ""); c.GPU != 40 {
		t.Fatalf("a served twice: %+v cached, want 40 tokens in GPU memory", c)
	}
	before := s.tiers(t)
	if n := s.blocks(t, "evict", httpapi.AdminEvictRequest{AdminPrefix: httpapi.AdminPrefix{Prompt: &a}, Keep: "host"}); n != 10 {
		t.Errorf("evict a: %d blocks, want 10", n)
	}
	after := s.tiers(t)
	if g := after.Tiers["gpu"]; g.ResidentBlocks != before.Tiers["gpu"].ResidentBlocks-10 || after.Tiers["host"].ResidentBlocks < 10 {
		t.Errorf("state before %+v, after %+v: want 10 blocks out of GPU memory, at least 10 in the host tier", before, after)
	}
	if c := s.cached(t, a, ""); c.GPU != 0 || c.Host != 40 {
		t.Errorf("a after its eviction to the host tier: %+v cached, want 40 tokens from the host tier", c)
	}
}

// TestAdminInvalidateTenant: two tenants send the same prompt; one is
// invalidated: its next completion has nothing cached, the other's all.
func TestAdminInvalidateTenant(t *testing.T) {
	s := startAdminServer(t)
	p := tokenPrompt(4, 41)
	s.cached(t, p, "x")
	s.cached(t, p, "y")
	before := s.tiers(t)
	if n := s.blocks(t, "invalidate-tenant", httpapi.AdminTenant{User: "x"}); n != 10 {
		t.Errorf("invalidate tenant x: %d blocks, want 10", n)
	}
	if after := s.tiers(t); after.Tiers["gpu"].ResidentBlocks != before.Tiers["gpu"].ResidentBlocks-10 {
		t.Errorf("GPU blocks %d before, %d after; want 10 fewer", before.Tiers["gpu"].ResidentBlocks, after.Tiers["gpu"].ResidentBlocks)
	}
	if c := s.cached(t, p, "x"); c.Sum() != 0 {
		t.Errorf("tenant x after its invalidation: %+v cached, want none", c)
	}
	if c := s.cached(t, p, "y"); c.GPU != 40 {
		t.Errorf("tenant y: %+v cached, want its 40 tokens in GPU memory", c)
	}
	if n := s.blocks(t, "invalidate-tenant", httpapi.AdminTenant{User: "nobody"}); n != 0 {
		t.Errorf("a tenant with no blocks: %d invalidated", n)
	}
}

// TestAdminFlushAndDrain: flush writes the blocks down to the NVMe tier;
// drain stops the server as SIGTERM does, cleanly.
func TestAdminFlushAndDrain(t *testing.T) {
	s := startAdminServer(t)
	s.cached(t, tokenPrompt(5, 41), "")
	if n := s.tiers(t).Tiers["nvme"].ResidentBlocks; n != 0 {
		t.Fatalf("%d blocks in the NVMe tier after one request, want 0 (seen-twice admission)", n)
	}
	var st httpapi.AdminStatus
	s.ok(t, http.MethodPost, "flush", nil, http.StatusOK, &st)
	if n := s.tiers(t).Tiers["nvme"].ResidentBlocks; st.Status != "flushed" || n < 10 {
		t.Errorf("flush: %+v, then %d blocks in the NVMe tier; want flushed and at least the prompt's 10", st, n)
	}
	s.ok(t, http.MethodPost, "drain", nil, http.StatusAccepted, &st)
	select {
	case err := <-s.done:
		s.stop = nil
		if err != nil || !strings.Contains(s.logs.String(), "stopped cleanly") {
			t.Fatalf("after drain: %v\n%s", err, s.logs)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the server did not stop within 60s of the drain")
	}
	if _, err := http.Get(s.url + "/healthz"); err == nil {
		t.Error("the server still answers after the drain")
	}
}

// TestAdminBadInput: each bad call gets 400 naming its field, and changes
// nothing.
func TestAdminBadInput(t *testing.T) {
	s := startAdminServer(t)
	p := tokenPrompt(6, 41)
	s.cached(t, p, "")
	before := s.tiers(t)
	for _, tc := range []struct {
		path, body, field string
	}{
		{"evict", `{"prompt": [1, 2, 3, 4, 5], "keep": "gpu"}`, "keep"},
		{"evict", `{"prompt": [1, 2, 3, 4, 5], "keep": "tape"}`, "keep"},
		{"evict", `{}`, "prompt"},
		{"invalidate", `{"prompt": [1, 2, 3, 4], "keys": ["0x1"]}`, "keys"},
		{"invalidate", `{"keys": ["12ab"]}`, "keys"},
		{"invalidate", `{"keys": ["0xnothex"]}`, "keys"},
		{"invalidate", `{"prompt": [1, 99999]}`, "prompt"},
		{"invalidate", `{"prompt": ""}`, "prompt"},
		{"invalidate", `{"prompt": [1, 2], "tenant": "x"}`, "body"},
		{"invalidate", `{"prompt": [1, 2]} {}`, "body"},
		{"invalidate", `not json`, "body"},
		{"invalidate-tenant", `{"user": 7}`, "user"},
		{"flush", `{"now": true}`, "body"},
		{"drain", `please`, "body"},
	} {
		status, b := s.call(t, adminToken, http.MethodPost, tc.path, tc.body)
		var e openai.ErrorResponse
		if status != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || e.Error.Param == nil || *e.Error.Param != tc.field {
			t.Errorf("%s %s: %d %s, want 400 naming %q", tc.path, tc.body, status, b, tc.field)
		}
	}
	// InUseBlocks is left out: the first request's write-through copies may
	// still hold its blocks at the first snapshot.
	after := s.tiers(t)
	b, a := before.Tiers["gpu"], after.Tiers["gpu"]
	b.InUseBlocks, a.InUseBlocks = 0, 0
	if a != b || after.Invalidations != before.Invalidations {
		t.Errorf("bad calls changed the cache: %+v, then %+v", before, after)
	}
	if c := s.cached(t, p, ""); c.GPU != 40 {
		t.Errorf("after the bad calls: %+v cached, want 40 in GPU memory", c)
	}
}

// TestAdminArgs: -admin-addr needs a token file of mode 0600, and a cache.
func TestAdminArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-admin-addr", "127.0.0.1:0"}, "-admin-addr without -admin-token-file"},
		{[]string{"-admin-token-file", "token"}, "-admin-token-file without -admin-addr"},
	} {
		_, err := parseArgs(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error with %q", tc.args, err, tc.want)
		}
	}
	good := writeSecret(t, "token", []byte(adminToken))
	loose := filepath.Join(t.TempDir(), "loose")
	if err := os.WriteFile(loose, []byte(adminToken), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := writeSecret(t, "empty", []byte("\n"))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{testArgs("-admin-addr", "127.0.0.1:0", "-admin-token-file", loose), "-admin-token-file " + loose + " may be read by group or others (mode 0644)"},
		{testArgs("-admin-addr", "127.0.0.1:0", "-admin-token-file", filepath.Join(t.TempDir(), "absent")), "-admin-token-file: open"},
		{testArgs("-admin-addr", "127.0.0.1:0", "-admin-token-file", empty), "-admin-token-file " + empty + " is empty"},
		{testArgs("-admin-addr", "nowhere:x", "-admin-token-file", good), "-admin-addr"},
		{testArgs("-admin-addr", "127.0.0.1:0", "-admin-token-file", good, "-strategy", "none"), "-admin-addr with -strategy none"},
	} {
		if err := startErr(t, tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error with %q", tc.args, err, tc.want)
		}
	}
}
