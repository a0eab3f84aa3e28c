// Package cudacodec runs package codec's FP8E4M3PerHead on the GPU: a
// quantize kernel (bf16 blocks in device memory to encoded blocks in device
// memory) and a dequantize kernel (back), launched on cudastream streams.
// Their output is byte for byte the Go reference's (codec.Encode and
// codec.Decode) for every input the reference accepts; the dequantize
// kernel does not check scales (codec.Decode does): it trusts blocks whose
// sums the tiers verified.
//
// The kernels are kernels/fp8.cu, compiled to kernels/fp8.ptx (the nvcc
// command is in the .cu's header and the go:generate line below) and
// loaded at run time through cudastream.ModuleLoader. A device without it
// (the simulator), or a driver that cannot JIT the PTX, gives
// cudastream.ErrNotSupported: callers then use package codec in Go.
package cudacodec

//go:generate nvcc -ptx -arch=sm_90 -o kernels/fp8.ptx kernels/fp8.cu

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/codec"
)

// kernelFiles holds kernels/fp8.cu and, once built, kernels/fp8.ptx.
//
//go:embed kernels
var kernelFiles embed.FS

const (
	ptxPath    = "kernels/fp8.ptx"
	quantize   = "kvtier_fp8_quantize"
	dequantize = "kvtier_fp8_dequantize"
	threads    = 256
	// MaxBlocks is the most blocks one Quantize or Dequantize call takes
	// (the grid's y dimension).
	MaxBlocks = 65535
)

// Kernels is the codec's module loaded on one device. Its methods may be
// called from any goroutine. The caller MUST Close it before closing the
// device.
type Kernels struct {
	mod        cudastream.Module
	quant, deq cudastream.Function
}

// Load loads the kernels on dev. It returns an error matching
// cudastream.ErrNotSupported when dev cannot run them: no ModuleLoader (the
// simulator), a build without kernels/fp8.ptx, or a driver that cannot
// compile it.
func Load(dev cudastream.Device) (*Kernels, error) {
	ptx, err := fs.ReadFile(kernelFiles, ptxPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("cudacodec: %s is not in this build (run go generate in kvtier/codec/cudacodec on a machine with nvcc): %w", ptxPath, cudastream.ErrNotSupported)
	} else if err != nil {
		return nil, fmt.Errorf("cudacodec: reading the embedded %s: %w", ptxPath, err)
	}
	return load(dev, ptxPath, string(ptx))
}

// load loads the module from ptx, named name in errors.
func load(dev cudastream.Device, name, ptx string) (*Kernels, error) {
	ml, ok := dev.(cudastream.ModuleLoader)
	if !ok {
		return nil, fmt.Errorf("cudacodec: the device (%s) cannot load PTX modules: %w", dev.Info().Name, cudastream.ErrNotSupported)
	}
	mod, err := ml.LoadModule(name, ptx)
	if err != nil {
		return nil, fmt.Errorf("cudacodec: %w", err)
	}
	k := &Kernels{mod: mod}
	if k.quant, err = mod.Function(quantize); err == nil {
		k.deq, err = mod.Function(dequantize)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("cudacodec: %w", err), mod.Unload())
	}
	return k, nil
}

// Close unloads the kernels. Work that launched them MUST have completed.
func (k *Kernels) Close() error { return k.mod.Unload() }

// Quantize enqueues on st the encoding of blocks bf16 blocks of shape s,
// block i at src + i*s.BlockBytes(), into encoded blocks (codec
// FP8E4M3PerHead), block i at dst + i*EncodedBytes. Both regions MUST be
// device memory of the stream's device, 16-byte aligned, not overlapping,
// and stay valid until an event recorded after the call has completed. A
// bad shape, block count or address enqueues nothing and names what was
// wrong.
func (k *Kernels) Quantize(st cudastream.Stream, s codec.Shape, dst, src cudastream.DevicePtr, blocks int) error {
	return k.launch("Quantize", k.quant, st, s, dst, src, blocks, true)
}

// Dequantize enqueues on st the decoding of blocks encoded blocks of shape
// s, block i at src + i*EncodedBytes, into bf16 blocks, block i at dst +
// i*s.BlockBytes(). The rules on memory are Quantize's.
func (k *Kernels) Dequantize(st cudastream.Stream, s codec.Shape, dst, src cudastream.DevicePtr, blocks int) error {
	return k.launch("Dequantize", k.deq, st, s, dst, src, blocks, false)
}

func (k *Kernels) launch(op string, fn cudastream.Function, st cudastream.Stream, s codec.Shape, dst, src cudastream.DevicePtr, blocks int, enc bool) error {
	encBytes, err := codec.EncodedBytes(codec.FP8E4M3PerHead, s)
	if err != nil {
		return fmt.Errorf("cudacodec: %s: %w", op, err)
	}
	switch {
	case blocks < 1 || blocks > MaxBlocks:
		return fmt.Errorf("cudacodec: %s: %w: blocks = %d, want 1..%d", op, cudastream.ErrInvalidValue, blocks, MaxBlocks)
	case src == 0 || src%16 != 0:
		return fmt.Errorf("cudacodec: %s: %w: src %#x is null or not 16-byte aligned", op, cudastream.ErrInvalidValue, uint64(src))
	case dst == 0 || dst%16 != 0:
		return fmt.Errorf("cudacodec: %s: %w: dst %#x is null or not 16-byte aligned", op, cudastream.ErrInvalidValue, uint64(dst))
	}
	l, ok := st.(cudastream.Launcher)
	if !ok {
		return fmt.Errorf("cudacodec: %s: the stream cannot launch kernels: %w", op, cudastream.ErrNotSupported)
	}
	srcStride, dstStride := s.BlockBytes(), encBytes
	if !enc {
		srcStride, dstStride = encBytes, s.BlockBytes()
	}
	cfg := cudastream.LaunchConfig{
		Grid:  [3]uint32{uint32(s.Layers * s.Parts), uint32(blocks), 1},
		Block: [3]uint32{threads, 1, 1},
	}
	args := [8]uint64{uint64(src), uint64(dst), uint64(srcStride), uint64(dstStride),
		uint64(s.Tokens), uint64(s.Heads), uint64(s.HeadDim), uint64(s.ScaleBytes())}
	if err := l.Launch(fn, cfg, args[:]); err != nil {
		return fmt.Errorf("cudacodec: %s of %d blocks of %+v: %w", op, blocks, s, err)
	}
	return nil
}
