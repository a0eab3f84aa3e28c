package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvtier.dev/examples/server/internal/httpapi"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/stack"
)

// heldRunner is a Runner whose passes, while held, wait until release is
// closed; entered is told when a pass starts waiting.
type heldRunner struct {
	Runner
	held    atomic.Bool
	release chan struct{}
	entered chan struct{}
}

func (r *heldRunner) Forward(tokens []int32, p model.Plan, fromCache []int32) ([]float32, int32, error) {
	if r.held.Load() {
		r.entered <- struct{}{}
		<-r.release
	}
	return r.Runner.Forward(tokens, p, fromCache)
}

// TestPrefetchWhileWaiting: a request that waits behind another's prefill
// has its NVMe blocks copied into the host tier meanwhile, and its prefill
// loads them from there, none from the drive.
func TestPrefetchWhileWaiting(t *testing.T) {
	run := &heldRunner{release: make(chan struct{}), entered: make(chan struct{}, 1)}
	e, cache := newTinyEngine(t, nil, func(o *stack.Options, c *Config) {
		o.NVMeDirs, o.NVMeBytes = []string{t.TempDir()}, 1<<20
		c.PrefetchBlocks = 64
		run.Runner = c.Runner
		c.Runner = run
	})
	bt := e.cfg.Model.BlockTokens
	prompt := make([]int32, 10*bt+2)
	for i := range prompt {
		prompt[i] = int32(7 + i%300)
	}
	complete(t, e, "first", prompt)
	ctx := context.Background()
	if err := cache.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := cache.Evict(ctx, 0, prompt[:10*bt], kvtier.NVMe); err != nil || n != 10 {
		t.Fatalf("Evict to NVMe: %d blocks, %v; want 10", n, err)
	}

	// Another request's prefill holds the GPU while prompt waits.
	run.held.Store(true)
	other := &httpapi.Request{ID: "other", Tokens: []int32{1, 2, 3}, MaxTokens: 1, Arrival: time.Now()}
	otherOut := httpapi.NewStream(1)
	if err := e.Submit(ctx, other, otherOut); err != nil {
		t.Fatal(err)
	}
	<-run.entered
	req := &httpapi.Request{ID: "waits", Tokens: prompt, MaxTokens: 1, Arrival: time.Now()}
	out := httpapi.NewStream(1)
	if err := e.Submit(ctx, req, out); err != nil {
		t.Fatal(err)
	}
	// Every prefetch has ended once all the tokens are taken, and its
	// copies once the cache drains.
	for range prefetchers {
		e.prefetchers <- struct{}{}
	}
	for range prefetchers {
		<-e.prefetchers
	}
	if err := cache.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(e.prefetched); got != 10 {
		t.Fatalf("%v blocks prefetched, want 10", got)
	}
	run.held.Store(false)
	close(run.release)
	for _, o := range []*httpapi.Stream{otherOut, out} {
		for range o.Tokens() {
		}
	}
	if _, err := otherOut.Result(); err != nil {
		t.Fatal(err)
	}
	u, err := out.Result()
	if err != nil {
		t.Fatal(err)
	}
	if u.LoadedTokens[kvtier.Host] != 10*bt || u.LoadedTokens[kvtier.NVMe] != 0 {
		t.Fatalf("the waiting request loaded %v tokens per tier, want %d from the host and none from NVMe", u.LoadedTokens, 10*bt)
	}
}
