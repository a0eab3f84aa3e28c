package engine

import (
	"context"
	"time"

	"kvtier.dev/examples/server/internal/httpapi"
	"kvtier.dev/kvtier"
)

// seq is one request from its prefill to its last token.
type seq struct {
	req     *httpapi.Request
	ctx     context.Context
	out     *httpapi.Stream
	noCache bool

	tokens  []int32 // the prompt, then each generated token
	slots   []int32 // region slot of each block of the whole sequence
	scratch []int32 // the scratch slots it holds
	look    kvtier.Lease
	ins     kvtier.Lease
	leased  bool // look and ins hold blocks until the sequence ends
	// prefetched: Engine.prefetch has taken it (under Engine.mu).
	prefetched bool
	// fetched, when not nil, is closed once its remote fetch has ended
	// (Engine.startFetch); it is not prefilled before.
	fetched chan struct{}
	sent    int
	usage   httpapi.Usage
	forward time.Duration // the prefill's forward passes
	// spaceWait is the prefill's wait for GPU slots (Engine.insert).
	spaceWait time.Duration
	// submitted is when Submit queued it (after the HTTP side parsed it).
	submitted time.Time
}

// positions is how many positions the sequence's KV takes at most: the
// prompt and every generated token but the last.
func (s *seq) positions() int { return len(s.req.Tokens) + s.req.MaxTokens - 1 }

// scratchPool hands out the region's slots after the cache's. Only the
// scheduler goroutine takes and returns them; free is read under Engine.mu
// by next, which runs on that goroutine too.
type scratchPool struct {
	slots []int32
}

func newScratchPool(first int32, n int) scratchPool {
	p := scratchPool{slots: make([]int32, n)}
	for i := range p.slots {
		p.slots[i] = first + int32(n-1-i) // lowest slots handed out first
	}
	return p
}

func (p *scratchPool) free() int { return len(p.slots) }

// take moves n slots into dst; the caller checked free.
func (p *scratchPool) take(dst []int32, n int) []int32 {
	k := len(p.slots) - n
	for i := len(p.slots) - 1; i >= k; i-- {
		dst = append(dst, p.slots[i])
	}
	p.slots = p.slots[:k]
	return dst
}

func (p *scratchPool) give(s []int32) {
	for i := len(s) - 1; i >= 0; i-- {
		p.slots = append(p.slots, s[i])
	}
}
