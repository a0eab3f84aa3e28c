// Package gpu runs package model's transformer on an NVIDIA GPU: matrix
// products through cuBLAS (bf16 inputs, fp32 accumulation, tensor cores),
// everything else through the CUDA C kernels in kernels/model.cu, whose PTX
// is embedded and loaded at run time. Nothing CUDA is needed to build: the
// driver (libcuda.so.1) and cuBLAS (libcublas.so.13, else .so.12) are opened
// at run time, and without cgo New reports that there is no GPU
// (errors.Is(err, cudastream.ErrNoDriver)).
//
// The KV cache lives in a region the caller allocates in the device's
// primary context (cudastream.Open's context; cudastream.Device.Alloc), laid
// out as package model describes (transfer.BlockFirstLayout), so kvtier's
// copy engine moves blocks in and out of the same memory the model reads.
// The model retains that primary context itself and works on the legacy
// default stream: a caller that loads blocks on other streams MUST either
// wait for those copies on the host (before Forward, or per layer through
// model.Plan.Ready) or hand the pass their events (model.Plan.LayerEvents,
// events of a cudastream device from Open): the stream then waits on them
// before each layer (cuStreamWaitEvent, which takes an event of any
// context) and the host enqueues the whole pass without blocking.
//
// Attention: the K and V of the sequence's positions are gathered from the
// blocks into a contiguous scratch buffer once per layer (16-byte copies of
// whole block pieces). A prefill then runs a fused kernel, scores never
// leaving the chip: on Hopper (compute capability 9.x, head dim 128)
// kernels/hopper.cu's kvm_flash_h128, warpgroup wgmma products for q·Kᵀ and
// P·V from swizzled shared-memory tiles, two warpgroups taking turns on the
// tensor cores so that one's online softmax runs beside the other's
// products, over K and a transposed V (kvm_gather_t); elsewhere model.cu's
// kvm_flash_d64/d128, mma.sync products (Options.Attention chooses). On
// the H200 at llama-3.1-8b's heads the wgmma kernel reaches 560 TFLOP/s
// at 32K causal rows against the mma kernel's 167 and PyTorch SDPA's 688
// (benchmarks/results/attention-h200.md). Options.StageTimes times each
// stage of a pass on the device (benchmarks/results/prefill-h200.md). A pass of few positions (a decode step)
// instead runs, per chunk of queries, one cuBLAS strided-batched product per
// query head of a group for the scores, a masked-softmax kernel, and a
// second product by V: a handful of queries cannot fill the GPU through the
// fused kernel's one CTA per 64 rows and head.
//
// Shapes: cuBLAS pays for the first product of a shape (a kernel loaded,
// a heuristic consulted), and nearly every request of a served trace
// computes a row count not seen before. So a pass's linear products run at
// RowBucket(rows), the attention products at keys rounded up to 64
// (padding rows and keys change no real output), and WarmUp, which a
// server calls before it listens, runs each bucket once. On the H200 (8B
// shapes, benchmarks/serve/shapes.sh) the first 7-token pass after 2,000
// cached tokens went from 65 ms to 10.3, its repeats from 15 ms to 10.5;
// Options.ExactRows restores exact shapes.
package gpu

import (
	_ "embed"
)

//go:embed kernels/model.ptx
var modelPTX string

//go:embed kernels/hopper.ptx
var hopperPTX string
