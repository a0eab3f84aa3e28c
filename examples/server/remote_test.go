package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"kvtier.dev/examples/server/internal/httpapi"
	"kvtier.dev/internal/openai"
	"kvtier.dev/internal/redistest"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/remote"
)

// TestServeRemoteTier: two servers share a prefix through the remote tier
// on a real Redis Cluster. The first computes a prompt and, the second time
// a request finds its blocks in the host tier, publishes them; after it
// shuts down (writing out its queue), a second server with empty local
// tiers answers the same prompt from blocks fetched from the remote tier,
// with the same greedy tokens.
func TestServeRemoteTier(t *testing.T) {
	addrs := strings.Join(redistest.Shared(t), ",")
	prefix := fmt.Sprintf("kvserve-test-%d:", time.Now().UnixNano())
	args := testArgs("-remote", addrs, "-remote-prefix", prefix, "-gpu-kv", "256KiB")
	p := tokenPrompt(3, 61) // 15 full blocks of 4 tokens before the last
	a := start(t, args...)
	want := a.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4)})
	for range 3 { // seen twice with a host copy: published
		time.Sleep(50 * time.Millisecond) // the write-through copies to the host tier
		if got := a.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4)}); !slices.Equal(got.Tokens, want.Tokens) {
			t.Fatalf("first server, cached: %v, want %v", got.Tokens, want.Tokens)
		}
	}
	if err := a.shutdown(); err != nil {
		t.Fatalf("shutdown: %v\n%s", err, a.logs)
	}

	b := start(t, args...)
	got := b.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4)})
	if !slices.Equal(got.Tokens, want.Tokens) {
		t.Errorf("second server: tokens %v, want %v", got.Tokens, want.Tokens)
	}
	d := got.Usage.PromptTokensDetails
	if d.CachedTokensByTier == nil || d.CachedTokensByTier.Host == 0 {
		t.Errorf("second server: usage %+v: want prompt tokens loaded from the host tier, fetched from the remote", d)
	}
	if err := b.shutdown(); err != nil {
		t.Fatalf("shutdown: %v\n%s", err, b.logs)
	}
}

// TestServeRemoteUnreachable: a -remote cluster that does not answer stops
// the server at start with an error naming the flag, and leaves nothing
// open.
func TestServeRemoteUnreachable(t *testing.T) {
	c, err := parseArgs(testArgs("-remote", "127.0.0.1:1"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c.log = slog.New(slog.DiscardHandler)
	err = run(context.Background(), &c, nil)
	if err == nil || !strings.Contains(err.Error(), "-remote") || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("run with an unreachable -remote: %v, want an error naming -remote and the address", err)
	}
}

// writeSecret writes a secret file of mode 0600 and returns its path.
func writeSecret(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// remoteCount is a kvserve_remote_* series of /metrics, by its label
// value ("" for none).
func remoteCount(t *testing.T, url, name, label string) float64 {
	t.Helper()
	f := scrape(t, url)[name]
	if f == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	for _, m := range f.Metric {
		if len(m.Label) == 0 && label == "" || len(m.Label) > 0 && m.Label[0].GetValue() == label {
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	t.Fatalf("/metrics has no %s{%s}", name, label)
	return 0
}

// forge writes, under prefix, values for the full blocks before p's last
// position that frame as the server's own (key, parent, position, salt
// and token digests, payload checksum) but hold KV of the forger's
// choosing: what anyone who can write the prefix, and lacks the
// deployment's key, can do. It returns the blocks written.
func forge(t *testing.T, addrs []string, prefix string, p openai.Prompt, args []string) int {
	t.Helper()
	id, m := testIdentity(t, args...)
	salt := id.Salt(kvtier.Salt(openai.SaltOf("", "")))
	bt := m.BlockTokens
	full := (len(p.Tokens) - 1) / bt
	h, err := kvtier.NewHasher(bt)
	if err != nil {
		t.Fatal(err)
	}
	keys := h.AppendKeys(nil, salt, 0, p.Tokens[:full*bt])
	st, err := remote.NewRedis(remote.RedisConfig{Addrs: addrs})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rc, err := remote.New(remote.Config{Store: st, Prefix: prefix, BlockBytes: int(m.BlockBytes())})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(39, 39))
	for i, k := range keys {
		meta := remote.BlockMeta{Key: uint64(k), Salt: uint64(salt), Position: i, Tokens: p.Tokens[i*bt : (i+1)*bt]}
		if i > 0 {
			meta.Parent = uint64(keys[i-1])
		}
		kv := make([]byte, m.BlockBytes())
		for j := range kv {
			kv[j] = byte(rng.Uint32())
		}
		if ok, err := rc.Put(meta, kv); !ok || err != nil {
			t.Fatalf("forging block %d: queued %v, %v", i, ok, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := rc.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rc.Close(); err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// TestServeForgedRemoteValueUnderKey: with -remote-checksum-key-file, a
// value that someone without the key wrote in the deployment's prefix,
// framed as the server's own, is never served: the answer is the no_cache
// one, /metrics counts the values corrupt and none fetched, and the log
// says so at Warn. Without the key (c9574bb's only mode, which the server
// now warns about) the same forgery is fetched and served.
func TestServeForgedRemoteValueUnderKey(t *testing.T) {
	addrs := redistest.Shared(t)
	p := tokenPrompt(16, 41)
	key := writeSecret(t, "remote.key", []byte("the deployment's key, 32 bytes..\n"))
	for _, keyed := range []bool{true, false} {
		prefix := fmt.Sprintf("kvserve-test-forge-%v-%d:", keyed, time.Now().UnixNano())
		args := testArgs("-remote", strings.Join(addrs, ","), "-remote-prefix", prefix, "-gpu-kv", "256KiB")
		if keyed {
			args = append(args, "-remote-checksum-key-file", key)
		}
		s := start(t, args...)
		unkeyedWarning := strings.Contains(s.logs.String(), "checksums are unkeyed")
		n := forge(t, addrs, prefix, p, args)
		got := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4)})
		corrupt := remoteCount(t, s.url, "kvserve_remote_reads_total", "corrupt")
		fetched := remoteCount(t, s.url, "kvserve_remote_fetched_blocks_total", "")
		if !keyed {
			if !unkeyedWarning || fetched == 0 {
				t.Errorf("unkeyed: warned %v, %v forged blocks fetched; want the warning, and the forgery served (what the key prevents)", unkeyedWarning, fetched)
			}
			continue
		}
		if want := s.noCacheTokens(t, p); !slices.Equal(got.Tokens, want) {
			t.Errorf("keyed: tokens %v over %d forged blocks, want the no_cache answer %v", got.Tokens, n, want)
		}
		if unkeyedWarning || corrupt != float64(n) || fetched != 0 {
			t.Errorf("keyed: unkeyed warning %v, %v values counted corrupt, %v fetched; want no warning, %d corrupt, none fetched", unkeyedWarning, corrupt, fetched, n)
		}
		if !strings.Contains(s.logs.String(), "level=WARN") || !strings.Contains(s.logs.String(), "did not verify") {
			t.Errorf("keyed: no Warn line for the forged values:\n%s", s.logs)
		}
		if err := s.shutdown(); err != nil {
			t.Fatalf("shutdown: %v\n%s", err, s.logs)
		}
	}
}

// TestServeRemotePassword: a cluster with requirepass refuses a server
// without -remote-password-file (NOAUTH, c9574bb's only way), and serves
// one with it; a password file others may read is refused.
func TestServeRemotePassword(t *testing.T) {
	const pw = "a password for the test cluster"
	cl := redistest.Private(t, redistest.Options{Password: pw})
	addrs := strings.Join(cl.Addrs(), ",")
	runErr := func(extra ...string) error {
		c, err := parseArgs(testArgs(append([]string{"-remote", addrs, "-remote-prefix", "kvserve-test-pw:"}, extra...)...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		c.log = slog.New(slog.DiscardHandler)
		return run(context.Background(), &c, nil)
	}
	if err := runErr(); err == nil || !strings.Contains(err.Error(), "-remote") || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("no password: %v, want an error naming -remote and NOAUTH", err)
	}
	loose := writeSecret(t, "pw", []byte(pw+"\n"))
	if err := os.Chmod(loose, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := runErr("-remote-password-file", loose); err == nil || !strings.Contains(err.Error(), "-remote-password-file") || !strings.Contains(err.Error(), "group or others") {
		t.Fatalf("a password file of mode 0644: %v, want it refused naming the flag", err)
	}
	s := start(t, testArgs("-remote", addrs, "-remote-prefix", "kvserve-test-pw:", "-remote-password-file", writeSecret(t, "pw", []byte(pw+"\n")))...)
	p := tokenPrompt(17, 21)
	if got, want := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4)}), s.noCacheTokens(t, p); !slices.Equal(got.Tokens, want) {
		t.Errorf("tokens %v, want %v", got.Tokens, want)
	}
	if err := s.shutdown(); err != nil {
		t.Fatalf("shutdown: %v\n%s", err, s.logs)
	}
}

// TestServeRemoteStalledDoesNotStallOthers: with every node of the
// cluster stopped (SIGSTOP: connections open, nothing answered), a request
// whose blocks must come from the remote tier waits for its fetch, off the
// model's goroutine, while a request queued after it that needs no remote
// block prefills and decodes to its end; the stalled one then recomputes
// (after -remote-op-timeout) and answers as without a cache. When the
// fetch ran on the model's goroutine, the second request waited for the
// first's fetch.
func TestServeRemoteStalledDoesNotStallOthers(t *testing.T) {
	cl := redistest.Private(t, redistest.Options{})
	args := testArgs("-remote", strings.Join(cl.Addrs(), ","), "-remote-prefix", "kvserve-test-stall:",
		"-remote-op-timeout", "4s", "-remote-fetch-timeout", "4s")
	s := start(t, args...)
	warm, cold := tokenPrompt(23, 41), tokenPrompt(29, 41)
	want := s.complete(t, openai.CompletionRequest{Prompt: warm, MaxTokens: maxTokens(4)}) // now cached here
	wantCold := s.noCacheTokens(t, cold)
	for _, n := range cl.Nodes {
		if err := n.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, n := range cl.Nodes {
			n.Resume()
		}
	})
	type answer struct {
		res *openai.Result
		err error
	}
	t0 := time.Now()
	send := func(p openai.Prompt, done chan<- answer) {
		defer func() { t.Logf("answered at %v", time.Since(t0)) }()
		c := openai.Client{URL: s.url + openai.CompletionsPath}
		res, err := c.Complete(context.Background(), openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4)})
		done <- answer{res, err}
	}
	coldDone, warmDone := make(chan answer, 1), make(chan answer, 1)
	go send(cold, coldDone)
	// The cold request is in, fetching, before the warm one comes (should
	// the warm one come first, it answers first however the fetch runs:
	// the test then proves nothing, and fails nothing).
	time.Sleep(300 * time.Millisecond)
	go send(warm, warmDone)
	var first answer
	select {
	case first = <-warmDone:
	case a := <-coldDone:
		t.Fatalf("the request whose fetch stalled answered (%v) before the one that needs no remote block", a.err)
	}
	if first.err != nil || !slices.Equal(first.res.Tokens, want.Tokens) {
		t.Fatalf("warm request: %v, tokens %v, want %v", first.err, first.res, want.Tokens)
	}
	c := <-coldDone
	if c.err != nil || !slices.Equal(c.res.Tokens, wantCold) {
		t.Fatalf("stalled request: %v, tokens %v, want %v", c.err, c.res, wantCold)
	}
	for _, n := range cl.Nodes {
		n.Resume()
	}
	if err := s.shutdown(); err != nil {
		t.Fatalf("shutdown: %v\n%s", err, s.logs)
	}
}

// TestAdminInvalidateReachesRemote: a prompt one server published to the
// remote tier, invalidated through a second server's operator API, is not
// fetched back: POST /admin/v1/invalidate deletes the prefix's blocks from
// the remote tier too (remote_blocks), or the next request would load
// what the operator told the cache to forget.
func TestAdminInvalidateReachesRemote(t *testing.T) {
	addrs := strings.Join(redistest.Shared(t), ",")
	prefix := fmt.Sprintf("kvserve-test-%d:", time.Now().UnixNano())
	remote := []string{"-remote", addrs, "-remote-prefix", prefix, "-gpu-kv", "256KiB"}
	p := tokenPrompt(5, 61) // 15 full blocks of 4 tokens before the last
	a := start(t, testArgs(remote...)...)
	// Published once seen twice with a host copy: the write-through copies
	// to the host tier land between requests, so send the prompt until
	// its 15 blocks have gone out (or give up after many tries).
	published := 0.0
	for try := 0; try < 200 && published < 15; try++ {
		a.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(1)})
		time.Sleep(10 * time.Millisecond)
		published = remoteCount(t, a.url, "kvserve_remote_published_blocks_total", "")
	}
	if published < 15 {
		t.Fatalf("%v blocks published to the remote tier, want the prompt's 15", published)
	}
	if err := a.shutdown(); err != nil { // the write-behind queue goes out first
		t.Fatalf("shutdown: %v\n%s", err, a.logs)
	}
	b := startAdminServer(t, remote...)
	var r httpapi.AdminBlocks
	b.ok(t, http.MethodPost, "invalidate", httpapi.AdminPrefix{Prompt: &p}, http.StatusOK, &r)
	if r.RemoteBlocks != 15 {
		t.Fatalf("invalidate: %+v, want the prompt's 15 blocks deleted from the remote tier", r)
	}
	if c := b.cached(t, p, ""); c.Host != 0 {
		t.Errorf("after the invalidation %+v tokens were cached, want none fetched from the remote", c)
	}
	if n := remoteCount(t, b.url, "kvserve_remote_fetched_blocks_total", ""); n != 0 {
		t.Errorf("%v blocks fetched from the remote after it was invalidated", n)
	}
}
