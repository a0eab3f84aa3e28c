package engine

import (
	"context"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/stack"
)

// full is the prompts' full blocks in slowWriteThrough's GPU tier of 32.
const full = 30

// slowWriteThrough is the tiny engine over a link that copies GPU blocks
// to the host at 1 MiB/s (a 4 KiB block takes 4 ms), and two prompts of
// full blocks each.
func slowWriteThrough(t *testing.T) (e *Engine, cache *stack.Cache, a, b []int32) {
	link := cudastream.H200Link()
	link.DtoHBytesPerSec = 1 << 20
	e, cache = newTinyEngineOn(t, link, nil)
	bt := e.cfg.Model.BlockTokens
	prompt := func(base int32) []int32 {
		p := make([]int32, full*bt+2)
		for i := range p {
			p[i] = base + int32(i%200)
		}
		return p
	}
	return e, cache, prompt(1), prompt(300)
}

// TestPrefillWaitsForGPUSlots: a prompt that fills the GPU tier is
// written through to the host over a slow link; the next prompt, another
// that fills it, finds every GPU block still read by those copies. Its
// prefill waits for them and caches all its blocks, so that it finds them
// all when it comes again; before, it computed the blocks it found no slot
// for in scratch and cached only what was free at once.
func TestPrefillWaitsForGPUSlots(t *testing.T) {
	e, _, a, b := slowWriteThrough(t)
	bt := e.cfg.Model.BlockTokens
	complete(t, e, "a", a)
	complete(t, e, "b", b) // a's 30 write-through copies take 120 ms
	u := complete(t, e, "b again", b)
	if got := u.LoadedTokens[kvtier.GPU]; got != full*bt {
		t.Fatalf("b again found %d tokens on the GPU, want all %d: its first prefill cached only what was free", got, full*bt)
	}
}

// TestLoadsWaitForGPUSlots: a prefix in the host tier comes again while
// every GPU slot is read by another prompt's write-through copies over a
// slow link. Its loads, refused a slot at first, wait for those copies and
// load every block; before, they were recomputed (and left uncached).
func TestLoadsWaitForGPUSlots(t *testing.T) {
	e, cache, a, b := slowWriteThrough(t)
	bt := e.cfg.Model.BlockTokens
	complete(t, e, "a", a)
	ctx := context.Background()
	if err := cache.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cache.Evict(ctx, 0, a[:full*bt], kvtier.Host); err != nil {
		t.Fatal(err)
	}
	complete(t, e, "b", b) // its 30 write-through copies take 120 ms
	u := complete(t, e, "a again", a)
	if got := u.LoadedTokens[kvtier.Host]; got != full*bt {
		t.Fatalf("a again loaded %d tokens from the host (recomputed %d), want all %d", got, u.RecomputedTokens, full*bt)
	}
}
