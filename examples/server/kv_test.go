package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"kvtier.dev/examples/server/internal/httpapi"
	"kvtier.dev/internal/openai"
)

// lookup asks the server's POST /v1/kv/lookup about a prompt.
func (s *server) lookup(t *testing.T, req httpapi.KVLookupRequest) httpapi.KVLookupResponse {
	t.Helper()
	body, err := json.Marshal(&req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(s.url+httpapi.KVPath+"lookup", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("lookup: %d %s", resp.StatusCode, b)
	}
	var r httpapi.KVLookupResponse
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestLookupIsWhatTheNextRequestLoads: for prompts new, repeated, pushed
// out of the GPU tier into the host tier, sharing a prefix, and of another
// tenant, POST /v1/kv/lookup answers per tier the cached tokens the next
// completion of the prompt reports in its usage.
func TestLookupIsWhatTheNextRequestLoads(t *testing.T) {
	s := start(t, testArgs()...) // a GPU tier of 32 blocks of 4 tokens
	// 40 tokens: the engine looks up 9 blocks, the tenth holding the last
	// position it computes.
	a, b, c := tokenPrompt(1, 40), tokenPrompt(2, 40), tokenPrompt(3, 40)
	shared := openai.TokenPrompt(append(append([]int32{}, a.Tokens[:22]...), b.Tokens[:18]...))
	steps := []struct {
		prompt openai.Prompt
		user   string
	}{
		{a, ""}, {a, ""}, {a, "other"}, {b, ""}, {shared, ""},
		{c, ""}, // the GPU tier is full: a's blocks go on in the host tier only
		{a, ""}, {c, ""}, {shared, ""}, {b, "other"},
	}
	kinds := map[string]bool{}
	for i, st := range steps {
		l := s.lookup(t, httpapi.KVLookupRequest{Prompt: st.prompt, User: st.user})
		res := s.complete(t, openai.CompletionRequest{Prompt: st.prompt, MaxTokens: ptr(2), User: st.user})
		d := res.Usage.PromptTokensDetails
		got := openai.TierTokens{GPU: l.Tiers["gpu"].CachedTokens, Host: l.Tiers["host"].CachedTokens, NVMe: l.Tiers["nvme"].CachedTokens}
		if d == nil || d.CachedTokensByTier == nil || *d.CachedTokensByTier != got || d.CachedTokens != l.CachedTokens {
			t.Fatalf("step %d: the lookup said %+v (%d tokens), the completion's usage %+v", i, got, l.CachedTokens, d)
		}
		if l.LookedUpTokens != 36 || l.PromptTokens != 40 {
			t.Fatalf("step %d: looked up %d of %d tokens, want 36 of 40", i, l.LookedUpTokens, l.PromptTokens)
		}
		t.Logf("step %d: %+v", i, got)
		kinds[map[bool]string{true: "none", false: "some"}[got.Sum() == 0]] = true
		if got.Host > 0 {
			kinds["host"] = true
		}
		if got.GPU > 0 && got.GPU < 36 {
			kinds["partial"] = true
		}
	}
	for _, k := range []string{"none", "some", "host", "partial"} {
		if !kinds[k] {
			t.Errorf("no step had a lookup of kind %q: the test exercised too little", k)
		}
	}
}

func ptr[T any](v T) *T { return &v }
