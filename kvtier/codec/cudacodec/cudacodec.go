// Package cudacodec runs package codec's FP8E4M3PerHead on the GPU: a
// quantize kernel (bf16 blocks in device memory to encoded blocks in device
// memory) and a dequantize kernel (back), launched on cudastream streams.
// Each comes in two forms: Quantize and Dequantize take bf16 blocks laid
// out one after another; QuantizeBlocks and DequantizeBlocks read or write
// them where a KV cache keeps them (a Layout: a block's parts anywhere),
// so that no copy gathers or scatters blocks around the coding.
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
	ptxPath          = "kernels/fp8.ptx"
	quantize         = "kvtier_fp8_quantize"
	dequantize       = "kvtier_fp8_dequantize"
	quantizeBlocks   = "kvtier_fp8_quantize_blocks"
	dequantizeBlocks = "kvtier_fp8_dequantize_blocks"
	threads          = 256
	// MaxBlocks is the most blocks one Quantize or Dequantize call takes
	// (the grid's y dimension), and the most a Layout's call takes.
	MaxBlocks = 65535
	// launchBlocks is how many GPU block numbers one launch of the _blocks
	// kernels carries: 8 parameters of two 32-bit numbers, beside the 8
	// others (cudastream.MaxLaunchArgs in all).
	launchBlocks = 2 * (cudastream.MaxLaunchArgs - 8)
)

// Kernels is the codec's module loaded on one device. Its methods may be
// called from any goroutine. The caller MUST Close it before closing the
// device.
type Kernels struct {
	mod                cudastream.Module
	quant, deq         cudastream.Function
	quantLaid, deqLaid cudastream.Function
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
	for _, f := range []struct {
		fn   *cudastream.Function
		name string
	}{{&k.quant, quantize}, {&k.deq, dequantize}, {&k.quantLaid, quantizeBlocks}, {&k.deqLaid, dequantizeBlocks}} {
		if *f.fn, err = mod.Function(f.name); err != nil {
			break
		}
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

// Layout is where a KV cache keeps its bf16 blocks, for QuantizeBlocks
// and DequantizeBlocks: part p (layer*Parts + K or V) of GPU block b is
// at the address stored at Table[p] plus b*Stride.
type Layout struct {
	// Table is device memory (16-byte aligned) holding Layers*Parts
	// little-endian uint64 addresses, each 16-byte aligned, every part of every block the
	// calls name lying inside memory the stream's device may write. The
	// kernels trust it: it is written once, when the cache is laid out.
	Table cudastream.DevicePtr
	// Stride is the distance between consecutive blocks' parts.
	Stride int64
}

// QuantizeBlocks enqueues on st the encoding of the GPU blocks named by
// blocks, each where l keeps it, into encoded blocks at dst, the i-th at
// dst + i*EncodedBytes. The memory rules are Quantize's; blocks may be
// reused once the call returns. It launches once per 16 blocks: a bad
// argument enqueues nothing, but a launch the driver refuses after
// others were enqueued leaves those enqueued (the error says how many).
func (k *Kernels) QuantizeBlocks(st cudastream.Stream, s codec.Shape, dst cudastream.DevicePtr, l Layout, blocks []int32) error {
	return k.launchLaid("QuantizeBlocks", k.quantLaid, st, s, dst, l, blocks, Layers{0, s.Layers})
}

// Layers is a range of a block's layers: Count layers from First.
type Layers struct{ First, Count int }

// DequantizeBlocks enqueues on st the decoding of layers of encoded blocks
// at src, the i-th at src + i*EncodedBytes, into the GPU blocks named by
// blocks, each where l keeps it: the layers in r only (Layers{0,
// s.Layers} for whole blocks), whose codes and the block's scales are
// all it reads of an encoded block. The rules are QuantizeBlocks'.
// blocks MUST NOT name a block twice.
func (k *Kernels) DequantizeBlocks(st cudastream.Stream, s codec.Shape, l Layout, src cudastream.DevicePtr, blocks []int32, r Layers) error {
	return k.launchLaid("DequantizeBlocks", k.deqLaid, st, s, src, l, blocks, r)
}

// launchLaid launches fn over blocks, launchBlocks at a time, for the
// layers in r; enc is the encoded side's address.
func (k *Kernels) launchLaid(op string, fn cudastream.Function, st cudastream.Stream, s codec.Shape, enc cudastream.DevicePtr, l Layout, blocks []int32, r Layers) error {
	if l.Stride <= 0 || l.Stride%16 != 0 {
		return fmt.Errorf("cudacodec: %s: %w: Layout.Stride %d is not a positive multiple of 16", op, cudastream.ErrInvalidValue, l.Stride)
	}
	for i, b := range blocks {
		if b < 0 {
			return fmt.Errorf("cudacodec: %s: %w: blocks[%d] = %d is negative", op, cudastream.ErrInvalidValue, i, b)
		}
	}
	if r.First < 0 || r.Count < 1 || r.First+r.Count > s.Layers {
		return fmt.Errorf("cudacodec: %s: %w: layers %d..%d of a block of %d", op, cudastream.ErrInvalidValue, r.First, r.First+r.Count-1, s.Layers)
	}
	encBytes, lr, err := checkLaunch(op, st, s, len(blocks), addr{enc, "the encoded blocks' address"}, addr{l.Table, "Layout.Table"})
	if err != nil {
		return err
	}
	lps := s.Layers * s.Parts
	// codec.Shape's bounds keep every field inside its bits (fp8.cu's
	// KV_TOKENS and the rest): tokens < 2^20, heads < 2^12, head dim and
	// parts < 2^16.
	shape := uint64(s.Tokens) | uint64(s.Heads)<<20 | uint64(s.HeadDim)<<32 | uint64(lps)<<48
	args := [cudastream.MaxLaunchArgs]uint64{0, uint64(encBytes), uint64(l.Table), uint64(l.Stride),
		shape, uint64(s.ScaleBytes()), uint64(r.First * s.Parts), 0}
	for done := 0; done < len(blocks); done += launchBlocks {
		part := blocks[done:min(len(blocks), done+launchBlocks)]
		args[0] = uint64(enc) + uint64(int64(done)*encBytes)
		clear(args[8:])
		for i, b := range part {
			args[8+i/2] |= uint64(uint32(b)) << (32 * (i % 2))
		}
		cfg := cudastream.LaunchConfig{
			Grid:  [3]uint32{uint32(r.Count * s.Parts), uint32(len(part)), 1},
			Block: [3]uint32{threads, 1, 1},
		}
		if err := lr.Launch(fn, cfg, args[:]); err != nil {
			return fmt.Errorf("cudacodec: %s of blocks %d..%d of %d of %+v (%d enqueued before): %w", op, done, done+len(part)-1, len(blocks), s, done, err)
		}
	}
	return nil
}

// addr is a device address a launch takes, and its name in errors.
type addr struct {
	p    cudastream.DevicePtr
	name string
}

// checkLaunch checks what every launch takes: the shape, the block count,
// the addresses (16-byte aligned, not null) and a stream that launches
// kernels. It returns the encoded block's bytes and the launcher.
func checkLaunch(op string, st cudastream.Stream, s codec.Shape, blocks int, addrs ...addr) (int64, cudastream.Launcher, error) {
	encBytes, err := codec.EncodedBytes(codec.FP8E4M3PerHead, s)
	if err != nil {
		return 0, nil, fmt.Errorf("cudacodec: %s: %w", op, err)
	}
	if blocks < 1 || blocks > MaxBlocks {
		return 0, nil, fmt.Errorf("cudacodec: %s: %w: blocks = %d, want 1..%d", op, cudastream.ErrInvalidValue, blocks, MaxBlocks)
	}
	for _, a := range addrs {
		if a.p == 0 || a.p%16 != 0 {
			return 0, nil, fmt.Errorf("cudacodec: %s: %w: %s %#x is null or not 16-byte aligned", op, cudastream.ErrInvalidValue, a.name, uint64(a.p))
		}
	}
	l, ok := st.(cudastream.Launcher)
	if !ok {
		return 0, nil, fmt.Errorf("cudacodec: %s: the stream cannot launch kernels: %w", op, cudastream.ErrNotSupported)
	}
	return encBytes, l, nil
}

func (k *Kernels) launch(op string, fn cudastream.Function, st cudastream.Stream, s codec.Shape, dst, src cudastream.DevicePtr, blocks int, enc bool) error {
	encBytes, l, err := checkLaunch(op, st, s, blocks, addr{src, "src"}, addr{dst, "dst"})
	if err != nil {
		return err
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
