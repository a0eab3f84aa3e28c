// Package model is a Llama-architecture transformer (RMSNorm, rotary
// embedding, grouped-query causal attention, SwiGLU MLP) whose KV cache lives
// in kvtier's paged GPU blocks, and its pure-Go CPU reference.
//
// Weights cannot be downloaded here, so a model has the real shapes of a
// preset (llama-3.1-8b, llama-3.2-1b, qwen2.5-7b, from kvtier/cost, so the
// cost model and the model agree on KV bytes per token by construction) and
// seeded weights: the compute, memory traffic and KV bytes are the real
// model's, the text it writes is meaningless. Every weight is a function of
// (seed, tensor, index) that the CPU and a GPU kernel evaluate alike (Value),
// and every value is exact in bf16, so both backends see identical weights.
//
// # KV layout
//
// The KV region is transfer.BlockFirstLayout: slot s holds one whole block,
// all layers, K then V, and within a (layer, part) the block's tokens in
// order, each kvHeads × headDim bf16 values:
//
//	region[s*BlockBytes + (layer*2+part)*PartBytes + (token*kvHeads+head)*headDim*2]
//
// Block-first, not layer-major, because it makes both sides fast. A block is
// one contiguous piece in GPU memory, in its pinned host slot and in its NVMe
// slot, so kvtier's copies move one descriptor per run of adjacent blocks
// (layer-major needs layers × 2 pieces per block: 64 for llama-3.1-8b) and a
// host slot is the block's bytes verbatim. Attention loses nothing: it reads
// one (layer, part) of a block as one contiguous PartBytes piece (32 KiB for
// llama-3.1-8b at 16 tokens a block), large enough for full-speed coalesced
// reads; the GPU gathers those pieces into a contiguous scratch buffer once
// per layer before its tensor-core products.
//
// # Plans
//
// A forward pass takes the whole sequence's tokens, the GPU slot of each of
// its blocks, and which positions to compute (Plan). Every other position's
// KV MUST already be in its slot: loaded by kvtier or computed earlier. A
// plan can compute the head, holes in the middle and the suffix in one pass;
// each computed token attends to every earlier position, present or computed.
//
// # Numerics
//
// The CPU reference computes in float32 and rounds to bf16 exactly where the
// GPU backend stores bf16 (normalised activations, projections, the KV cache,
// attention probabilities, the MLP's product); the residual stream and the
// logits stay float32. The two backends then differ only by summation order.
package model
