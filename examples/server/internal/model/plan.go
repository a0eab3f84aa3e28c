package model

import (
	"fmt"

	"kvtier.dev/cudastream"
)

// Plan says, for one sequence, where each block's KV lives and which
// positions a forward pass computes.
type Plan struct {
	// Slots[b] is the KV region slot of the sequence's block b (tokens
	// [b*BlockTokens, (b+1)*BlockTokens)), as the Manager handed it out
	// (Block.GPUSlot). Slots MUST be distinct.
	Slots []int32
	// Compute lists the positions to compute, ascending. Their KV is
	// written into their blocks; every other position below the last one
	// MUST already hold its KV. The last position of the sequence MUST be
	// computed: the pass returns its logits.
	Compute []int32
	// Ready, if set, is called at the start of each layer, before the
	// layer reads any KV it did not compute; it returns once that layer's
	// KV of the present positions is in its slots (kvtier's per-layer
	// readiness: Lease.WaitLayer), or an error that ends the pass. A
	// GPU backend calls it while the device still runs the layers before,
	// so loads and compute overlap.
	Ready func(layer int) error
	// LayerEvents, if set, lets a backend wait for layer l's KV on the
	// device instead of calling Ready: it appends to dst the events that
	// complete once that layer's KV of the present positions is in its
	// slots (kvtier's Lease.LayerEvents), and the backend's stream waits
	// on them before the layer reads that KV (cuStreamWaitEvent), so the
	// host enqueues every layer without blocking. Such a wait does not see
	// the loads' errors: the caller MUST check them after the pass
	// (kvtier's Manager.Wait) and, if one failed, use neither the pass's
	// output nor the KV it wrote. A backend with no device stream (CPU)
	// calls Ready, so a caller that sets this sets Ready too.
	LayerEvents func(layer int, dst []cudastream.Event) ([]cudastream.Event, error)
}

// AppendBlockPositions appends to dst the positions of the blocks that
// compute marks, for a sequence of n tokens (the last block may be short):
// the per-block form of Plan.Compute. compute[b] false means block b is
// present (loaded or computed earlier).
func AppendBlockPositions(dst []int32, blockTokens, n int, compute []bool) []int32 {
	for b, c := range compute {
		if !c {
			continue
		}
		for p := b * blockTokens; p < min((b+1)*blockTokens, n); p++ {
			dst = append(dst, int32(p))
		}
	}
	return dst
}

// Blocks is the number of blocks n tokens take.
func (c Config) Blocks(n int) int { return (n + c.BlockTokens - 1) / c.BlockTokens }

// Check rejects a plan that does not fit tokens, the config or a region of
// numSlots slots, naming what is wrong. Backends call it before any work.
func (c Config) Check(tokens []int32, p Plan, numSlots int) error {
	n := len(tokens)
	switch {
	case n == 0:
		return fmt.Errorf("model: forward: no tokens")
	case len(p.Slots) != c.Blocks(n):
		return fmt.Errorf("model: forward: %d tokens take %d blocks of %d, plan has %d slots", n, c.Blocks(n), c.BlockTokens, len(p.Slots))
	case len(p.Compute) == 0 || p.Compute[len(p.Compute)-1] != int32(n-1):
		return fmt.Errorf("model: forward: Plan.Compute must end at the last position %d", n-1)
	}
	for i, s := range p.Slots {
		if s < 0 || int(s) >= numSlots {
			return fmt.Errorf("model: forward: Plan.Slots[%d] = %d outside the region's %d slots", i, s, numSlots)
		}
	}
	prev := int32(-1) // so that a negative first position is rejected
	for i, q := range p.Compute {
		if q <= prev {
			return fmt.Errorf("model: forward: Plan.Compute[%d] = %d is not above the previous position %d", i, q, prev)
		}
		prev = q
	}

	for _, q := range p.Compute {
		if t := tokens[q]; t < 0 || int(t) >= c.Vocab {
			return fmt.Errorf("model: forward: token %d at position %d outside the vocabulary of %d", t, q, c.Vocab)
		}
	}
	return nil
}
