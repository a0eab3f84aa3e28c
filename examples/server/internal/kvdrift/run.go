package kvdrift

import (
	"fmt"

	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/internal/benchserve"
)

// Forwarder is a backend's forward pass (model.CPU, the GPU runtime's
// Model): it returns the last position's logits, valid until its next
// call, and their argmax.
type Forwarder interface {
	Forward(tokens []int32, p model.Plan) ([]float32, int32, error)
}

// Recoder puts the round trip of blocks where a backend reads them: for
// each i, what a tier gives back for the block in slot src[i] is written
// into slot dst[i]. The model MUST NOT run meanwhile; Recode returns once
// the blocks are in place.
type Recoder interface {
	Recode(src, dst []int32) error
}

// Setup is what every prompt of an experiment shares.
type Setup struct {
	Config  model.Config
	Model   Forwarder
	Recoder Recoder
	// Steps is the continuation's length in tokens, e.g. 32: the tail's
	// greedy token and Steps-1 decode steps after it.
	Steps int
	// Tolerance is the near-tie tolerance in nats, e.g.
	// benchserve.DefaultVerifyTolerance.
	Tolerance float64
	// OneShotReference makes the reference side continue from the
	// one-shot prefill (its logits and KV) instead of its own tail pass
	// over the cached blocks: with a CopyRecoder, the comparison is then
	// of reuse itself against no reuse, the baseline a codec is judged by.
	OneShotReference bool
}

// Prompt is one prompt: Tokens, of which the first Cached are reused (a
// whole number of blocks, at least one, and at least one token after
// them).
type Prompt struct {
	Tokens []int32
	Cached int
}

// Result is one prompt's comparison.
type Result struct {
	CachedTokens int `json:"cached_tokens"`
	Tokens       int `json:"prompt_tokens"`
	// Noise is the tail's logits over the original blocks against a
	// one-shot prefill of the whole prompt.
	Noise Drift `json:"noise"`
	// Prefill is the tail's logits over the round trip against over the
	// original blocks; Continuation the largest such drift at every
	// position the two continuations reached with the same tokens, the
	// tail's included.
	Prefill      Drift `json:"prefill"`
	Continuation Drift `json:"continuation"`
	// LogprobDrift is the largest difference, at those positions, of the
	// log-probability (nats) of the token both chose: what bench-serve
	// --verify's max_drift measures.
	LogprobDrift float64 `json:"logprob_drift"`
	// Agree reports equal continuations. Otherwise FirstDiff is the
	// index in the continuation of the first differing token, Gap the
	// near-tie rule's gap there (nats) and Tie whether it is a near tie.
	Agree     bool    `json:"agree"`
	FirstDiff int     `json:"first_diff"`
	Gap       float64 `json:"gap"`
	Tie       bool    `json:"tie"`
	// Compared is the continuation tokens compared: Steps when they
	// agree, FirstDiff+1 otherwise.
	Compared int `json:"compared"`
}

// SlotsPerSide is how many slots each side of Run needs for a prompt of
// n tokens.
func (s *Setup) SlotsPerSide(n int) int { return s.Config.Blocks(n + s.Steps - 1) }

// check names what is wrong with s, p or the slots.
func (s *Setup) check(p Prompt, ref, rec []int32) error {
	c, n := s.Config, len(p.Tokens)
	switch {
	case s.Model == nil || s.Recoder == nil:
		return fmt.Errorf("kvdrift: Setup needs a Model and a Recoder")
	case s.Steps < 1:
		return fmt.Errorf("kvdrift: Setup.Steps must be at least 1, got %d", s.Steps)
	case !(s.Tolerance >= 0):
		return fmt.Errorf("kvdrift: Setup.Tolerance must be 0 or more nats, got %g", s.Tolerance)
	case p.Cached < c.BlockTokens || p.Cached%c.BlockTokens != 0 || p.Cached >= n:
		return fmt.Errorf("kvdrift: Prompt.Cached %d must be a positive multiple of %d below the prompt's %d tokens", p.Cached, c.BlockTokens, n)
	case len(ref) < s.SlotsPerSide(n) || len(rec) < s.SlotsPerSide(n):
		return fmt.Errorf("kvdrift: %d and %d slots per side; a prompt of %d tokens and %d steps needs %d", len(ref), len(rec), n, s.Steps, s.SlotsPerSide(n))
	}
	seen := make(map[int32]bool, len(ref)+len(rec))
	for _, sl := range append(ref[:s.SlotsPerSide(n):s.SlotsPerSide(n)], rec[:s.SlotsPerSide(n)]...) {
		if seen[sl] {
			return fmt.Errorf("kvdrift: slot %d given twice: the two sides' slots must be distinct", sl)
		}
		seen[sl] = true
	}
	return nil
}

// Run compares p's tail and continuation over the original blocks (slots
// ref) and over their round trip (slots rec): a one-shot prefill of p into
// ref; the round trip of its cached blocks into rec; the tail computed on
// top of each side's blocks (the reference's is the one-shot prefill with
// Setup.OneShotReference; its Noise is then 0); then both sides' greedy
// continuations, step by step, until they differ or reach Steps tokens.
// It overwrites the slots' contents.
func Run(s Setup, p Prompt, ref, rec []int32) (Result, error) {
	if err := s.check(p, ref, rec); err != nil {
		return Result{}, err
	}
	c, n := s.Config, len(p.Tokens)
	k := p.Cached / c.BlockTokens
	r := Result{CachedTokens: p.Cached, Tokens: n, FirstDiff: -1}
	l0, next0, err := s.Model.Forward(p.Tokens, model.Plan{Slots: ref[:c.Blocks(n)], Compute: span(0, n)})
	if err != nil {
		return r, fmt.Errorf("kvdrift: one-shot prefill of %d tokens: %w", n, err)
	}
	oneShot := append([]float32(nil), l0...)
	if err := s.Recoder.Recode(ref[:k], rec[:k]); err != nil {
		return r, fmt.Errorf("kvdrift: round trip of %d blocks: %w", k, err)
	}
	a := side{fw: s.Model, tok: append(make([]int32, 0, n+s.Steps), p.Tokens...), slots: ref}
	b := side{fw: s.Model, tok: append(make([]int32, 0, n+s.Steps), p.Tokens...), slots: rec}
	tail := span(p.Cached, n)
	sides := []*side{&a, &b}
	if s.OneShotReference {
		a.logits, a.next, sides = oneShot, next0, sides[1:]
	}
	for _, sd := range sides {
		if err := sd.forward(c, tail); err != nil {
			return r, fmt.Errorf("kvdrift: the tail after %d cached tokens: %w", p.Cached, err)
		}
	}
	r.Noise, r.Prefill = Compare(oneShot, a.logits), Compare(a.logits, b.logits)
	return r, s.continueBoth(&r, &a, &b)
}

// continueBoth runs the two continuations from their tails' logits and
// fills r's continuation fields.
func (s *Setup) continueBoth(r *Result, a, b *side) error {
	for i := 0; ; i++ {
		if a.next != b.next {
			av, bv := a.logits, b.logits
			r.FirstDiff, r.Compared = i, i+1
			r.Gap = benchserve.TieGap(float64(av[a.next]-av[b.next]), float64(bv[b.next]-bv[a.next]))
			r.Tie = benchserve.NearTie(r.Gap, s.Tolerance)
			return nil
		}
		r.Continuation = r.Continuation.Max(Compare(a.logits, b.logits))
		d := logprob(a.logits, a.next) - logprob(b.logits, b.next)
		r.LogprobDrift = max(r.LogprobDrift, d, -d)
		if i == s.Steps-1 {
			r.Agree, r.Compared = true, s.Steps
			return nil
		}
		for _, sd := range []*side{a, b} {
			sd.tok = append(sd.tok, sd.next)
			if err := sd.forward(s.Config, []int32{int32(len(sd.tok) - 1)}); err != nil {
				return fmt.Errorf("kvdrift: continuation step %d: %w", i+1, err)
			}
		}
	}
}

// side is one of Run's two computations: its tokens so far, its slots, and
// its last pass's logits (a copy) and greedy token.
type side struct {
	fw     Forwarder
	tok    []int32
	slots  []int32
	logits []float32
	next   int32
}

func (sd *side) forward(c model.Config, compute []int32) error {
	l, next, err := sd.fw.Forward(sd.tok, model.Plan{Slots: sd.slots[:c.Blocks(len(sd.tok))], Compute: compute})
	if err != nil {
		return err
	}
	sd.logits, sd.next = append(sd.logits[:0], l...), next
	return nil
}

// span is the positions [from, to).
func span(from, to int) []int32 {
	p := make([]int32, 0, to-from)
	for q := from; q < to; q++ {
		p = append(p, int32(q))
	}
	return p
}
