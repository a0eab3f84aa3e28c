package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"kvtier.dev/internal/openai"
	"kvtier.dev/internal/redistest"
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
