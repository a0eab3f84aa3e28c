package cudacodec

import (
	"errors"
	"strings"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/codec"
)

var llama8B = codec.Shape{Layers: 32, Parts: 2, Tokens: 16, Heads: 8, HeadDim: 128}

func newSim(t *testing.T) *cudastream.Sim {
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

// TestLoadOnSim: the simulator runs no PTX; Load says so with
// ErrNotSupported, and callers use package codec in Go.
func TestLoadOnSim(t *testing.T) {
	if _, err := Load(newSim(t)); !errors.Is(err, cudastream.ErrNotSupported) {
		t.Fatalf("Load on the simulator: %v, want ErrNotSupported", err)
	}
}

// TestLaunchArgs: every bad argument is refused before anything is
// enqueued, naming what was wrong.
func TestLaunchArgs(t *testing.T) {
	st := simStream(t)
	k := &Kernels{}
	cases := []struct {
		s        codec.Shape
		dst, src cudastream.DevicePtr
		blocks   int
		want     error
		says     string
	}{
		{shp(32, 2, 16, 8, 100), 16, 16, 1, codec.ErrShape, "HeadDim"},
		{llama8B, 16, 16, 0, cudastream.ErrInvalidValue, "blocks = 0"},
		{llama8B, 16, 16, MaxBlocks + 1, cudastream.ErrInvalidValue, "blocks = 65536"},
		{llama8B, 16, 0, 1, cudastream.ErrInvalidValue, "src 0x0"},
		{llama8B, 16, 24, 1, cudastream.ErrInvalidValue, "src 0x18"},
		{llama8B, 8, 16, 1, cudastream.ErrInvalidValue, "dst 0x8"},
		{llama8B, 16, 16, 1, cudastream.ErrNotSupported, "cannot launch"}, // a simulator stream
	}
	for _, c := range cases {
		for _, op := range []string{"Quantize", "Dequantize"} {
			f := k.Quantize
			if op == "Dequantize" {
				f = k.Dequantize
			}
			err := f(st, c.s, c.dst, c.src, c.blocks)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), op) {
				t.Errorf("%s(%+v, dst %#x, src %#x, %d blocks) = %v, want %v naming %s and %q", op, c.s, c.dst, c.src, c.blocks, err, c.want, op, c.says)
			}
		}
	}
}

// TestLaunchBlocksArgs: QuantizeBlocks and DequantizeBlocks refuse every
// bad argument before anything is enqueued, naming what was wrong.
func TestLaunchBlocksArgs(t *testing.T) {
	st := simStream(t)
	k := &Kernels{}
	ok := Layout{Table: 256, Stride: 32768}
	cases := []struct {
		s      codec.Shape
		enc    cudastream.DevicePtr
		l      Layout
		blocks []int32
		r      Layers
		want   error
		says   string
	}{
		{shp(32, 2, 16, 8, 100), 16, ok, []int32{0}, Layers{0, 32}, codec.ErrShape, "HeadDim"},
		{llama8B, 16, ok, nil, Layers{0, 32}, cudastream.ErrInvalidValue, "blocks = 0"},
		{llama8B, 16, ok, make([]int32, MaxBlocks+1), Layers{0, 32}, cudastream.ErrInvalidValue, "blocks = 65536"},
		{llama8B, 16, ok, []int32{3, -1}, Layers{0, 32}, cudastream.ErrInvalidValue, "blocks[1] = -1"},
		{llama8B, 0, ok, []int32{0}, Layers{0, 32}, cudastream.ErrInvalidValue, "encoded blocks' address 0x0"},
		{llama8B, 24, ok, []int32{0}, Layers{0, 32}, cudastream.ErrInvalidValue, "encoded blocks' address 0x18"},
		{llama8B, 16, Layout{Table: 0, Stride: 32768}, []int32{0}, Layers{0, 32}, cudastream.ErrInvalidValue, "Layout.Table 0x0"},
		{llama8B, 16, Layout{Table: 8, Stride: 32768}, []int32{0}, Layers{0, 32}, cudastream.ErrInvalidValue, "Layout.Table 0x8"},
		{llama8B, 16, Layout{Table: 256, Stride: 0}, []int32{0}, Layers{0, 32}, cudastream.ErrInvalidValue, "Layout.Stride 0"},
		{llama8B, 16, Layout{Table: 256, Stride: 24}, []int32{0}, Layers{0, 32}, cudastream.ErrInvalidValue, "Layout.Stride 24"},
		{llama8B, 16, ok, []int32{0}, Layers{32, 1}, cudastream.ErrInvalidValue, "layers 32..32 of a block of 32"},
		{llama8B, 16, ok, []int32{0}, Layers{0, 0}, cudastream.ErrInvalidValue, "layers 0..-1"},
		{llama8B, 16, ok, []int32{0}, Layers{-1, 2}, cudastream.ErrInvalidValue, "layers -1..0"},
		{llama8B, 16, ok, []int32{0}, Layers{0, 32}, cudastream.ErrNotSupported, "cannot launch"}, // a simulator stream
	}
	for _, c := range cases {
		for _, op := range []string{"QuantizeBlocks", "DequantizeBlocks"} {
			if op == "QuantizeBlocks" && c.r != (Layers{0, 32}) {
				continue // QuantizeBlocks codes whole blocks
			}
			var err error
			if op == "QuantizeBlocks" {
				err = k.QuantizeBlocks(st, c.s, c.enc, c.l, c.blocks)
			} else {
				err = k.DequantizeBlocks(st, c.s, c.l, c.enc, c.blocks, c.r)
			}
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), op) {
				t.Errorf("%s(%+v, enc %#x, %+v, %d blocks) = %v, want %v naming %s and %q", op, c.s, c.enc, c.l, len(c.blocks), err, c.want, op, c.says)
			}
		}
	}
}

// simStream is a simulator's stream: it cannot launch kernels, so a call
// that passes every check ends in ErrNotSupported.
func simStream(t *testing.T) cudastream.Stream {
	st, err := newSim(t).NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Destroy() })
	return st
}

func shp(layers, parts, tokens, heads, headDim int) codec.Shape {
	return codec.Shape{Layers: layers, Parts: parts, Tokens: tokens, Heads: heads, HeadDim: headDim}
}
