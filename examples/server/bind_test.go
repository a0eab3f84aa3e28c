package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier/nvme"
)

// The cache is bound to the model's weights: the wrong-answer cases of
// issue 39 (a restart with other weights over the same -nvme-dir, a slab
// file another user could write), end to end through the server.

// noCacheTokens answers p without the cache: the reference answer.
func (s *server) noCacheTokens(t *testing.T, p openai.Prompt) []int32 {
	t.Helper()
	return s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4), NoCache: true}).Tokens
}

// TestServeSeedChangeClearsNVMe: a server with -seed 1 leaves its blocks
// in -nvme-dir; a restart with -seed 2 over it must not serve them (on
// c9574bb it adopted every one and its answers differed from no_cache):
// it clears the directory, says so in its log naming the weights it was
// written for, and answers as without a cache. Back to -seed 1, the
// blocks of seed 2 are cleared in turn.
func TestServeSeedChangeClearsNVMe(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kv")
	prompts := []openai.Prompt{tokenPrompt(11, 49), tokenPrompt(12, 37), tokenPrompt(13, 45)}
	seed1 := serveAll(t, dir, prompts, "-seed", "1")
	if st := openStore(t, dir, "-seed", "1"); st.Len() == 0 {
		t.Fatal("the seed 1 server left no block on the drive: the restart would test nothing")
	} else if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	s := start(t, testArgs("-nvme-dir", dir, "-seed", "2")...)
	differ := false
	for i, p := range prompts {
		r := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4)})
		want := s.noCacheTokens(t, p)
		if !slices.Equal(r.Tokens, want) {
			t.Errorf("prompt %d with -seed 2: tokens %v, want the no_cache answer %v", i, r.Tokens, want)
		}
		if d := r.Usage.PromptTokensDetails.CachedTokensByTier; d != nil && d.NVMe != 0 {
			t.Errorf("prompt %d with -seed 2: %d prompt tokens loaded from the NVMe tier seed 1 wrote", i, d.NVMe)
		}
		differ = differ || !slices.Equal(want, seed1[i].Tokens)
	}
	if !differ {
		t.Fatal("seeds 1 and 2 answer every prompt alike: the test cannot tell their KV apart")
	}
	logs := s.logs.String()
	if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "written for another model: cleared") || !strings.Contains(logs, "weights=seed:1") {
		t.Errorf("the log does not say the directory of seed 1 was cleared:\n%s", logs)
	}
	if err := s.shutdown(); err != nil {
		t.Fatalf("shutdown: %v\n%s", err, s.logs)
	}

	again := start(t, testArgs("-nvme-dir", dir, "-seed", "1")...)
	for i, p := range prompts {
		if r := again.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4)}); !slices.Equal(r.Tokens, seed1[i].Tokens) {
			t.Errorf("prompt %d back with -seed 1: tokens %v, want %v", i, r.Tokens, seed1[i].Tokens)
		}
	}
	if !strings.Contains(again.logs.String(), "weights=seed:2") {
		t.Errorf("back with -seed 1, the log does not say seed 2's blocks were cleared:\n%s", again.logs)
	}
}

// openStore opens the NVMe tier a server started with testArgs and extra
// leaves in dir, as that server would.
func openStore(t *testing.T, dir string, extra ...string) *nvme.Store {
	t.Helper()
	st, err := nvme.Open(nvme.Config{Dirs: []string{dir}, SlotsPerFile: 512, BlockBytes: 4096, MaxTokens: 4, Model: testModel(t, testArgs(extra...)...)})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestServeForeignWritableSlab: a slab file in -nvme-dir that others may
// write (mode 0666: on c9574bb another user re-signed its slots and 40 of
// 60 answers were wrong) stops the start with an error naming the file
// and -nvme-reformat, and changes nothing; with -nvme-reformat the file
// is made 0600 and emptied, and the answers are the reference ones.
func TestServeForeignWritableSlab(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kv")
	prompts := []openai.Prompt{tokenPrompt(14, 49), tokenPrompt(15, 41)}
	first := serveAll(t, dir, prompts)
	slab := filepath.Join(dir, "kvtier-slab-000.kvs")
	if err := os.Chmod(slab, 0o666); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(slab)
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseArgs(testArgs("-nvme-dir", dir), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c.log = slog.New(slog.DiscardHandler)
	err = run(context.Background(), &c, nil)
	if err == nil || !strings.Contains(err.Error(), slab) || !strings.Contains(err.Error(), "group or others") || !strings.Contains(err.Error(), "-nvme-reformat") {
		t.Fatalf("a start over a slab of mode 0666: %v, want an error naming the file and -nvme-reformat", err)
	}
	if after, _ := os.ReadFile(slab); !slices.Equal(before, after) {
		t.Fatal("the refused start changed the slab file")
	}

	s := start(t, testArgs("-nvme-dir", dir, "-nvme-reformat")...)
	if fi, err := os.Stat(slab); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("after -nvme-reformat the slab is %v (%v), want mode 0600", fi.Mode(), err)
	}
	for i, p := range prompts {
		r := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4)})
		if !slices.Equal(r.Tokens, first[i].Tokens) {
			t.Errorf("prompt %d: tokens %v, want %v", i, r.Tokens, first[i].Tokens)
		}
		if d := r.Usage.PromptTokensDetails.CachedTokensByTier; d != nil && d.NVMe != 0 {
			t.Errorf("prompt %d: %d tokens loaded from the reformatted slab", i, d.NVMe)
		}
	}
}
