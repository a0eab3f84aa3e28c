package cudacodec

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/gputest"
)

// benchBlocks 2 MiB blocks (llama-3.1-8b, 16 tokens) move per iteration.
const benchBlocks = 64

// rig holds a benchmark's device, streams and buffers: the out direction
// reads dRaw (quantized through dEnc) into pinned hRaw/hEnc, the in
// direction writes from hRaw/hEnc into dRaw2 (through dEnc2).
type rig struct {
	dev                      cudastream.Device
	k                        *Kernels
	ks, cs, ks2, cs2         cudastream.Stream
	dRaw, dEnc, dRaw2, dEnc2 cudastream.DevicePtr
	hRaw, hEnc               []byte
	evOut, evIn              []cudastream.Event
	raw, enc                 int64
}

func newRig(b *testing.B) *rig {
	dev := gputest.Device(b)
	r := &rig{dev: dev, k: loadKernels(b, dev), raw: llama8B.BlockBytes(), enc: mustEncoded(b, llama8B)}
	for _, p := range []*cudastream.Stream{&r.ks, &r.cs, &r.ks2, &r.cs2} {
		st, err := dev.NewStream(0)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Destroy() })
		*p = st
	}
	r.dRaw, r.dRaw2 = devAlloc(b, dev, benchBlocks*r.raw), devAlloc(b, dev, benchBlocks*r.raw)
	r.dEnc, r.dEnc2 = devAlloc(b, dev, benchBlocks*r.enc), devAlloc(b, dev, benchBlocks*r.enc)
	r.hRaw, r.hEnc = gputest.HostAlloc(b, dev, benchBlocks*r.raw), gputest.HostAlloc(b, dev, benchBlocks*r.enc)
	fill(r.hRaw, func(i int) uint16 { return bf16(float64(i%251-125) * 0.01) })
	for i := range 2 * benchBlocks / benchChunk {
		ev, err := dev.NewEvent(cudastream.EventOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ev.Destroy() })
		if i < benchBlocks/benchChunk {
			r.evOut = append(r.evOut, ev)
		} else {
			r.evIn = append(r.evIn, ev)
		}
	}
	// Real blocks on both sides: the host's encoded copy comes from the kernel.
	r.check(b, r.cs.CopyHtoD(r.dRaw, r.hRaw))
	r.check(b, r.cs.Synchronize())
	r.move(b, true, false, true)
	r.check(b, r.cs.Synchronize())
	return r
}

func (r *rig) check(b *testing.B, err error) {
	if err != nil {
		b.Fatal(err)
	}
}

// benchChunk blocks go per kernel launch and per copy: a mover codes a
// transfer's blocks in few launches, not one per block.
const benchChunk = 8

// outChunk enqueues the out direction of blocks [i, i+benchChunk): with
// the codec, their quantize on ks, then their copy on cs once it is done
// (while ks quantizes the next chunk).
func (r *rig) outChunk(b *testing.B, i int64, codec bool) {
	if !codec {
		r.check(b, r.cs.CopyDtoH(r.hRaw[i*r.raw:(i+benchChunk)*r.raw], r.dRaw+cudastream.DevicePtr(i*r.raw)))
		return
	}
	e := r.dEnc + cudastream.DevicePtr(i*r.enc)
	r.check(b, r.k.Quantize(r.ks, llama8B, e, r.dRaw+cudastream.DevicePtr(i*r.raw), benchChunk))
	ev := r.evOut[i/benchChunk]
	r.check(b, ev.Record(r.ks))
	r.check(b, r.cs.WaitEvent(ev))
	r.check(b, r.cs.CopyDtoH(r.hEnc[i*r.enc:(i+benchChunk)*r.enc], e))
}

// inChunk enqueues the in direction of blocks [i, i+benchChunk): with the
// codec, their copy on cs2, then their dequantize on ks2 (while cs2
// copies the next chunk in).
func (r *rig) inChunk(b *testing.B, i int64, codec bool) {
	if !codec {
		r.check(b, r.cs2.CopyHtoD(r.dRaw2+cudastream.DevicePtr(i*r.raw), r.hRaw[i*r.raw:(i+benchChunk)*r.raw]))
		return
	}
	e := r.dEnc2 + cudastream.DevicePtr(i*r.enc)
	r.check(b, r.cs2.CopyHtoD(e, r.hEnc[i*r.enc:(i+benchChunk)*r.enc]))
	ev := r.evIn[i/benchChunk]
	r.check(b, ev.Record(r.cs2))
	r.check(b, r.ks2.WaitEvent(ev))
	r.check(b, r.k.Dequantize(r.ks2, llama8B, r.dRaw2+cudastream.DevicePtr(i*r.raw), e, benchChunk))
}

// move enqueues the directions asked for, chunk by chunk, the two
// directions' chunks interleaved.
func (r *rig) move(b *testing.B, out, in, codec bool) {
	for i := int64(0); i < benchBlocks; i += benchChunk {
		if out {
			r.outChunk(b, i, codec)
		}
		if in {
			r.inChunk(b, i, codec)
		}
	}
}

func (r *rig) sync(b *testing.B) {
	for _, st := range []cudastream.Stream{r.ks, r.cs, r.ks2, r.cs2} {
		r.check(b, st.Synchronize())
	}
}

// BenchmarkCuCodec: 64 blocks of 2 MiB (bf16) between device memory and
// pinned host memory, plain copies against the codec's kernels with the
// encoded bytes on the link. Bytes/s count bf16 bytes, so the codec beats
// the plain copy when the kernels hide behind the halved transfer.
func BenchmarkCuCodec(b *testing.B) {
	r := newRig(b)
	cases := []struct {
		name    string
		out, in bool // directions
		codec   bool
	}{
		{"d2h/copy", true, false, false}, {"d2h/quantize+copy", true, false, true},
		{"h2d/copy", false, true, false}, {"h2d/copy+dequantize", false, true, true},
		{"both/copy", true, true, false}, {"both/codec", true, true, true},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			n := int64(0)
			if c.out {
				n += benchBlocks * r.raw
			}
			if c.in {
				n += benchBlocks * r.raw
			}
			b.SetBytes(n)
			for b.Loop() {
				r.move(b, c.out, c.in, c.codec)
				r.sync(b)
			}
		})
	}
}

// BenchmarkCuKernels times the kernels alone on 64 blocks in device
// memory, each way: the contiguous kernels in one launch, the _blocks
// ones over a block-first layout of the same blocks named in a shuffled
// order, 16 a launch (bytes/s count bf16 bytes).
func BenchmarkCuKernels(b *testing.B) {
	r := newRig(b)
	lps := llama8B.Layers * llama8B.Parts
	table := make([]byte, 8*lps)
	for p := range lps {
		binary.LittleEndian.PutUint64(table[8*p:], uint64(r.dRaw2)+uint64(int64(p)*r.raw/int64(lps)))
	}
	dTable := devAlloc(b, r.dev, int64(len(table)))
	r.check(b, r.ks.CopyHtoD(dTable, table))
	r.check(b, r.ks.Synchronize())
	l := Layout{Table: dTable, Stride: r.raw}
	ids := make([]int32, benchBlocks)
	for i, v := range rand.New(rand.NewPCG(37, 10)).Perm(benchBlocks) {
		ids[i] = int32(v)
	}
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"quantize", func() error { return r.k.Quantize(r.ks, llama8B, r.dEnc, r.dRaw, benchBlocks) }},
		{"dequantize", func() error { return r.k.Dequantize(r.ks, llama8B, r.dRaw2, r.dEnc, benchBlocks) }},
		{"quantize-blocks", func() error { return r.k.QuantizeBlocks(r.ks, llama8B, r.dEnc2, l, ids) }},
		{"dequantize-blocks", func() error { return r.k.DequantizeBlocks(r.ks, llama8B, l, r.dEnc, ids, Layers{0, llama8B.Layers}) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(benchBlocks * r.raw)
			for b.Loop() {
				r.check(b, c.run())
				r.check(b, r.ks.Synchronize())
			}
		})
	}
}
