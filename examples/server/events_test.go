package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"kvtier.dev/examples/server/internal/httpapi"
	"kvtier.dev/examples/server/internal/kvevents/vllmtest"
	"kvtier.dev/internal/openai"
	"kvtier.dev/internal/redistest"
	"kvtier.dev/kvtier"
)

// gauge reads a series of fams (a gauge or a counter) with the given tier
// label ("" for none), or -1.
func gauge(fams map[string]*dto.MetricFamily, name, tier string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	for _, m := range f.Metric {
		match := tier == ""
		for _, l := range m.Label {
			match = match || (l.GetName() == "tier" && l.GetValue() == tier)
		}
		if !match {
			continue
		}
		if m.Gauge != nil {
			return m.Gauge.GetValue()
		}
		return m.Counter.GetValue()
	}
	return -1
}

// asked is a prompt and tenant the test sent.
type asked struct {
	prompt openai.Prompt
	user   string
	salt   kvtier.Salt // the cache's salt of the user's blocks (cacheSalt)
}

// mediumOf is the medium vLLM's events name a tier by.
var mediumOf = map[string]string{"gpu": "GPU", "host": "CPU", "nvme": "DISK"}

// checkpoint waits until the server is at rest (no copy or lease holds a
// block, every event of the cache published), takes the consumer's index
// then, and checks it against the server: per tier, the blocks it holds
// (the resident gauges) and, for each prompt asked, the leading run of
// blocks it holds (POST /v1/kv/lookup).
func checkpoint(t *testing.T, s *server, c *vllmtest.Consumer, prompts []asked) vllmtest.State {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		fams := scrape(t, s.url)
		inUse := 0.0
		for tier := range mediumOf {
			inUse += gauge(fams, "kvtier_in_use_blocks", tier)
		}
		events := gauge(fams, "kvtier_events_total", "")
		if inUse != 0 || gauge(fams, "kvserve_kv_events_published_seq", "") < events {
			time.Sleep(10 * time.Millisecond) // background copies, or the publisher, still at work
			continue
		}
		st := c.Until(uint64(gauge(fams, "kvserve_kv_events_messages_total", "")) - 1)
		looks := make([]httpapi.KVLookupResponse, len(prompts))
		for i, a := range prompts {
			looks[i] = s.lookup(t, httpapi.KVLookupRequest{Prompt: a.prompt, User: a.user})
		}
		after := scrape(t, s.url)
		if gauge(after, "kvtier_events_total", "") != events {
			continue // something moved meanwhile: again
		}
		for tier, medium := range mediumOf {
			if n := gauge(after, "kvtier_resident_blocks", tier); int(n) != len(st.Media[medium]) {
				t.Errorf("the %s tier holds %v blocks; the consumer's index has %d in %s", tier, n, len(st.Media[medium]), medium)
			}
		}
		h, err := kvtier.NewHasher(4)
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range prompts {
			keys := h.AppendKeys(nil, a.salt, 0, a.prompt.Tokens[:looks[i].LookedUpTokens])
			for tier, medium := range mediumOf {
				n := 0
				for n < len(keys) {
					if _, ok := st.Media[medium][uint64(keys[n])]; !ok {
						break
					}
					n++
				}
				if want := looks[i].Tiers[tier].PrefixTokens; 4*n != want {
					t.Errorf("prompt %d (user %q): the consumer's %s index leads with %d tokens, the server's %s tier %d", i, a.user, medium, 4*n, tier, want)
				}
			}
		}
		return st
	}
	t.Fatal("the server did not come to rest within 60 s")
	return vllmtest.State{}
}

// TestVLLMConsumerFollowsTheServer: a consumer of vLLM's wire format that
// no one here wrote (libzmq, the msgpack package, vLLM's documented
// schema) follows a run of the server whose tiers fill and evict: before
// each request its index holds every block the request then reports
// cached; at every rest it holds exactly what each tier holds (so every
// eviction was announced); its sequence has no gap at this load.
func TestVLLMConsumerFollowsTheServer(t *testing.T) {
	vllmtest.Python(t)
	args := testArgs("-kv-events-zmq", "127.0.0.1:0", "-kv-events-replay", "127.0.0.1:0")
	s := start(t, args...)
	saltOf := func(user string) kvtier.Salt { return cacheSalt(t, args, kvtier.Salt(openai.SaltOf(user, ""))) }
	addr := func(key string) string {
		m := regexp.MustCompile(key + `=(\S+)`).FindStringSubmatch(s.logs.String())
		if m == nil {
			t.Fatalf("no %s address in the log:\n%s", key, s.logs.String())
		}
		return m[1]
	}
	c := vllmtest.Start(t, addr("zmq"), addr("replay"), "kv-events", false)
	// 12 prompts of 10 blocks and 2 tenants: more than the GPU tier's 32
	// blocks and the host tier's 64.
	var pool []asked
	for i := range 12 {
		user := []string{"", "b"}[i%2]
		pool = append(pool, asked{tokenPrompt(10+i, 40), user, saltOf(user)})
	}
	rng := rand.New(rand.NewPCG(7, 7))
	var sent []asked
	cached := 0
	for i := range 32 {
		a := pool[rng.IntN(len(pool))]
		before := checkpoint(t, s, c, sent)
		res := s.complete(t, openai.CompletionRequest{Prompt: a.prompt, MaxTokens: ptr(1), User: a.user})
		n := res.Usage.PromptTokensDetails.CachedTokens
		cached += n
		h, _ := kvtier.NewHasher(4)
		keys := h.AppendKeys(nil, a.salt, 0, a.prompt.Tokens[:n])
		for j, k := range keys {
			found := false
			for _, blocks := range before.Media {
				_, ok := blocks[uint64(k)]
				found = found || ok
			}
			if !found {
				t.Errorf("request %d reported block %d cached, which was not announced before it", i, j)
			}
		}
		sent = append(sent, a)
	}
	final := checkpoint(t, s, c, sent)
	fams := scrape(t, s.url)
	if len(final.Gaps) != 0 || len(final.LiveGaps) > 1 || gauge(fams, "kvserve_kv_events_dropped_total", "") != 0 ||
		gauge(fams, "kvserve_kv_events_lost_total", "") != 0 || gauge(fams, "kvtier_events_lost_total", "") != 0 {
		t.Errorf("gaps %v, live gaps %v; dropped %v, lost %v", final.Gaps, final.LiveGaps,
			gauge(fams, "kvserve_kv_events_dropped_total", ""), gauge(fams, "kvserve_kv_events_lost_total", ""))
	}
	if cached == 0 || final.Events == 0 || final.Clears != 1 || len(final.Media["CPU"]) == 0 || gauge(fams, "kvtier_evictions_total", "gpu") == 0 ||
		gauge(fams, "kvtier_evictions_total", "host") == 0 {
		t.Errorf("the run exercised too little: %d tokens cached, %d events, %d clears, %d host blocks, %v GPU evictions",
			cached, final.Events, final.Clears, len(final.Media["CPU"]), gauge(fams, "kvtier_evictions_total", "gpu"))
	}
	t.Logf("%d tokens cached, %d events in %d messages (%d replayed), blocks indexed per medium: GPU %d, CPU %d, DISK %d; evictions: gpu %v, host %v",
		cached, final.Events, final.Last+1, final.Replayed, len(final.Media["GPU"]), len(final.Media["CPU"]), len(final.Media["DISK"]),
		gauge(fams, "kvtier_evictions_total", "gpu"), gauge(fams, "kvtier_evictions_total", "host"))
}

func TestKVEventArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-kv-events-buffer", "-1"}, "-kv-events-buffer -1"},
		{[]string{"-kv-events-buffer", "16777217"}, "-kv-events-buffer 16777217"},
		{[]string{"-kv-events-zmq", "127.0.0.1:0", "-kv-events-buffer", "0"}, "-kv-events-zmq with -kv-events-buffer 0"},
		{[]string{"-kv-events-replay", "127.0.0.1:0"}, "-kv-events-replay without -kv-events-zmq"},
		{[]string{"-kv-events-replay-batches", "0"}, "-kv-events-replay-batches 0"},
	} {
		_, err := parseArgs(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error with %q", tc.args, err, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{testArgs("-strategy", "none", "-kv-events-zmq", "127.0.0.1:0"), "-kv-events-zmq with -strategy none"},
		{testArgs("-kv-events-zmq", "nowhere:x"), "PUB address"},
	} {
		if err := startErr(t, tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error with %q", tc.args, err, tc.want)
		}
	}
}

// TestRemoteBlocksAnnounced: blocks the server publishes to the shared
// remote tier (a real Redis Cluster) are announced in its events, tier
// remote, once written.
func TestRemoteBlocksAnnounced(t *testing.T) {
	addrs := strings.Join(redistest.Shared(t), ",")
	prefix := fmt.Sprintf("kvserve-events-test-%d:", time.Now().UnixNano())
	args := testArgs("-remote", addrs, "-remote-prefix", prefix, "-gpu-kv", "256KiB")
	s := start(t, args...)
	client := &http.Client{Timeout: 60 * time.Second}
	resp, err := client.Get(s.url + httpapi.KVPath + "events?from=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := tokenPrompt(5, 61) // 15 full blocks before the last
	for range 3 {           // the second time a request finds them in the host tier: published
		s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(1)})
	}
	sc := bufio.NewScanner(resp.Body)
	keys, _ := kvtier.NewHasher(4)
	want := map[string]bool{}
	for _, k := range keys.AppendKeys(nil, cacheSalt(t, args, 0), 0, p.Tokens[:60]) {
		want["0x"+strconv.FormatUint(uint64(k), 16)] = true
	}
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev httpapi.KVEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Tier == "remote" {
			if ev.Kind != "BlockStored" || !want[ev.Key] || len(ev.TokenIDs) != 4 {
				t.Fatalf("remote event %+v is not a block of the prompt", ev)
			}
			return
		}
	}
	t.Fatalf("no remote block announced: %v", sc.Err())
}

// cacheSalt is the salt a server started with args keys tenant's blocks
// under: the tenant's folded with the model's identity (stack.Model.Salt).
func cacheSalt(t *testing.T, args []string, tenant kvtier.Salt) kvtier.Salt {
	t.Helper()
	id, _ := testIdentity(t, args...)
	return id.Salt(tenant)
}
