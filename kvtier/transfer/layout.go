package transfer

import (
	"fmt"

	"kvtier.dev/cudastream"
)

// GPULayout says where the server keeps KV blocks in device memory. KV is cut
// into parts: for each layer, K and V (Parts = 2), or a single latent tensor
// for multi-head latent attention (Parts = 1). One block of one (layer, part)
// is PartBytes long, and block b of (layer l, part p) lives at
//
//	Base[l*Parts+p] + b*BlockStride
//
// That one formula covers the common layouts:
//
//   - vLLM's per-layer tensors [num_blocks, block_tokens, kv_heads, head_dim],
//     one for K and one for V: Base holds each tensor's address and
//     BlockStride = PartBytes (see PerLayerLayout);
//   - one layer-first buffer [layers][parts][num_blocks][...] (LayerFirstLayout);
//   - one block-first buffer [num_blocks][layers][parts][...], where a whole
//     block is contiguous (BlockFirstLayout).
type GPULayout struct {
	Layers      int
	Parts       int
	PartBytes   int64
	NumBlocks   int
	BlockStride int64
	Base        []cudastream.DevicePtr // len Layers*Parts
}

// PerLayerLayout describes separate K and V tensors per layer, as vLLM keeps
// them: k[l] and v[l] are the base addresses of layer l's tensors, each
// [numBlocks, blockTokens, kvHeads, headDim] of dtypeBytes elements.
// Pass v == nil for a single tensor per layer (MLA).
func PerLayerLayout(k, v []cudastream.DevicePtr, numBlocks int, partBytes int64) (GPULayout, error) {
	parts := 2
	if v == nil {
		parts = 1
	} else if len(v) != len(k) {
		return GPULayout{}, fmt.Errorf("transfer: PerLayerLayout: %d K tensors but %d V tensors", len(k), len(v))
	}
	base := make([]cudastream.DevicePtr, 0, len(k)*parts)
	for l := range k {
		base = append(base, k[l])
		if v != nil {
			base = append(base, v[l])
		}
	}
	g := GPULayout{Layers: len(k), Parts: parts, PartBytes: partBytes, NumBlocks: numBlocks, BlockStride: partBytes, Base: base}
	return g, g.Validate()
}

// LayerFirstLayout describes one buffer at base holding, for each layer and
// part in turn, all numBlocks blocks.
func LayerFirstLayout(base cudastream.DevicePtr, layers, parts, numBlocks int, partBytes int64) (GPULayout, error) {
	g := GPULayout{Layers: layers, Parts: parts, PartBytes: partBytes, NumBlocks: numBlocks, BlockStride: partBytes}
	if err := g.validateShape(); err != nil {
		return GPULayout{}, err
	}
	g.Base = make([]cudastream.DevicePtr, layers*parts)
	for i := range g.Base {
		g.Base[i] = base + cudastream.DevicePtr(int64(i)*int64(numBlocks)*partBytes)
	}
	return g, nil
}

// BlockFirstLayout describes one buffer at base holding numBlocks blocks,
// each with all its layers and parts contiguous.
func BlockFirstLayout(base cudastream.DevicePtr, layers, parts, numBlocks int, partBytes int64) (GPULayout, error) {
	g := GPULayout{Layers: layers, Parts: parts, PartBytes: partBytes, NumBlocks: numBlocks, BlockStride: int64(layers*parts) * partBytes}
	if err := g.validateShape(); err != nil {
		return GPULayout{}, err
	}
	g.Base = make([]cudastream.DevicePtr, layers*parts)
	for i := range g.Base {
		g.Base[i] = base + cudastream.DevicePtr(int64(i)*partBytes)
	}
	return g, nil
}

func (g GPULayout) validateShape() error {
	switch {
	case g.Layers <= 0:
		return fmt.Errorf("transfer: GPULayout.Layers must be positive, got %d", g.Layers)
	case g.Parts != 1 && g.Parts != 2:
		return fmt.Errorf("transfer: GPULayout.Parts must be 1 or 2, got %d", g.Parts)
	case g.PartBytes <= 0:
		return fmt.Errorf("transfer: GPULayout.PartBytes must be positive, got %d", g.PartBytes)
	case g.NumBlocks <= 0:
		return fmt.Errorf("transfer: GPULayout.NumBlocks must be positive, got %d", g.NumBlocks)
	case g.BlockStride < g.PartBytes:
		return fmt.Errorf("transfer: GPULayout.BlockStride %d is smaller than PartBytes %d: blocks would overlap", g.BlockStride, g.PartBytes)
	}
	return nil
}

// Validate checks the layout's shape.
func (g GPULayout) Validate() error {
	if err := g.validateShape(); err != nil {
		return err
	}
	if len(g.Base) != g.Layers*g.Parts {
		return fmt.Errorf("transfer: GPULayout.Base has %d addresses, want Layers*Parts = %d", len(g.Base), g.Layers*g.Parts)
	}
	for i, b := range g.Base {
		if b == 0 {
			return fmt.Errorf("transfer: GPULayout.Base[%d] (layer %d, part %d) is a null device pointer", i, i/g.Parts, i%g.Parts)
		}
	}
	return nil
}

// BlockBytes is one block's size over all layers and parts.
func (g GPULayout) BlockBytes() int64 { return int64(g.Layers*g.Parts) * g.PartBytes }

// addr is the device address of (block, layer, part).
func (g *GPULayout) addr(block int32, layer, part int) uint64 {
	return uint64(g.Base[layer*g.Parts+part]) + uint64(int64(block)*g.BlockStride)
}

// HostLayout is the host pool: fixed-size slots, each holding one block with
// all its layers and parts contiguous, in (layer, part) order. Large
// contiguous host blocks move far faster than scattered ones, and a whole slot
// is one read or write for the NVMe tier.
type HostLayout struct {
	// Pool is the pinned (registered) memory holding the slots. It MUST stay
	// registered while the engine uses it.
	Pool []byte
	// SlotBytes is the size of one slot: at least the block's bytes; larger
	// values leave room for alignment (a multiple of 4096 suits O_DIRECT).
	SlotBytes int64
	// RegistrationBytes is the unit in which Pool was registered with the
	// device (pinned.Region.ChunkBytes), or 0 when the whole pool is one
	// registration. The driver refuses a copy that spans two registrations,
	// so copies are never coalesced across a registration boundary, and a
	// slot MUST NOT straddle one: RegistrationBytes is a multiple of
	// SlotBytes (pinned.Options.ChunkMultiple arranges it).
	RegistrationBytes int64
	// RegistrationOffset is where Pool starts within its registration,
	// when Pool is not the start of the registered region: registrations
	// begin at Pool offsets k*RegistrationBytes - RegistrationOffset. For
	// a pool carved out of a pinned.Region after n other slots, it is
	// n*SlotBytes modulo RegistrationBytes. A multiple of SlotBytes, below
	// RegistrationBytes.
	RegistrationOffset int64
}

// startsRegistration reports whether slot s is the first of a registration
// (other than the pool's first).
func (h *HostLayout) startsRegistration(s int32) bool {
	return h.RegistrationBytes > 0 && s > 0 && (h.RegistrationOffset+int64(s)*h.SlotBytes)%h.RegistrationBytes == 0
}

// Slots is the number of whole slots in the pool.
func (h HostLayout) Slots() int {
	if h.SlotBytes <= 0 {
		return 0
	}
	return int(int64(len(h.Pool)) / h.SlotBytes)
}

// Slot returns slot s's bytes.
func (h HostLayout) Slot(s int32) []byte {
	off := int64(s) * h.SlotBytes
	return h.Pool[off : off+h.SlotBytes : off+h.SlotBytes]
}

// Pair maps one block between its place on the GPU and its host slot.
type Pair struct {
	GPUBlock int32
	HostSlot int32
}
