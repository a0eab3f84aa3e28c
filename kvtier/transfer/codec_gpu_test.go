package transfer

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/gputest"
	"kvtier.dev/kvtier/codec"
)

// The codec path on the real device, with package cudacodec's kernels:
//
//	go test -c -o .gpu/transfer.test ./kvtier/transfer
//	KVTIER_REQUIRE_GPU=1 ./.gpu/transfer.test -test.run GPUCodec -test.v
//	./.gpu/transfer.test -test.run '^$' -test.bench GPUCodec -test.benchtime 20x -test.count 5

// gpuCodecShape is llama-3.1-8b's block of 16 tokens: 2 MiB as bf16.
var gpuCodecShape = codec.Shape{Layers: 32, Parts: 2, Tokens: 16, Heads: 8, HeadDim: 128}

const gpuCodecBlocks = 128

// codecRig is a KV region of gpuCodecBlocks 2 MiB blocks in a layout and
// a pinned pool of as many slots.
type codecRig struct {
	dev  cudastream.Device
	gpu  GPULayout
	host HostLayout
	part int64
}

func newCodecRig(t testing.TB, layout string) *codecRig {
	dev := gputest.Device(t)
	s := gpuCodecShape
	raw := s.BlockBytes()
	region, err := dev.Alloc(gpuCodecBlocks * raw)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Free(region) })
	r := &codecRig{dev: dev, part: raw / int64(s.Layers*s.Parts)}
	if layout == "layer-first" {
		r.gpu, err = LayerFirstLayout(region, s.Layers, s.Parts, gpuCodecBlocks, r.part)
	} else {
		r.gpu, err = BlockFirstLayout(region, s.Layers, s.Parts, gpuCodecBlocks, r.part)
	}
	if err != nil {
		t.Fatal(err)
	}
	r.host = HostLayout{Pool: gputest.HostAlloc(t, dev, gpuCodecBlocks*raw), SlotBytes: raw}
	return r
}

func (r *codecRig) engine(t testing.TB, c codec.Codec, edit ...func(*Config)) *Engine {
	cfg := Config{GPU: r.gpu, Host: r.host}
	if c != codec.None {
		cfg.Codec, cfg.CodecShape = c, gpuCodecShape
	}
	for _, f := range edit {
		f(&cfg)
	}
	return newTestEngine(t, r.dev, cfg)
}

// copyBlock moves GPU block b of the rig's layout to or from buf, piece
// by piece, in (layer, part) order.
func (r *codecRig) copyBlock(t testing.TB, st cudastream.Stream, b int32, buf []byte, toGPU bool) {
	g := &r.gpu
	for lp := range g.Layers * g.Parts {
		p := cudastream.DevicePtr(g.addr(b, lp/g.Parts, lp%g.Parts))
		piece := buf[int64(lp)*r.part : int64(lp+1)*r.part]
		var err error
		if toGPU {
			err = st.CopyHtoD(p, piece)
		} else {
			err = st.CopyDtoH(piece, p)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

// TestGPUCodecRoundTrip: GPU -> host -> GPU through the codec path with
// the CUDA kernels equals the Go reference byte for byte: each host slot
// holds codec.Encode of its block, and each block onboarded back holds
// codec.Decode of that. Both layouts; 40 blocks, 5 chunks of 8. Each
// transfer reports its first chunk's launch, timed on the device
// (Config.OnCodecKernel).
func TestGPUCodecRoundTrip(t *testing.T) {
	for _, layout := range []string{"layer-first", "block-first"} {
		t.Run(layout, func(t *testing.T) {
			r := newCodecRig(t, layout)
			var mu sync.Mutex
			var launches []CodecKernel
			e := r.engine(t, codec.FP8E4M3PerHead, func(c *Config) {
				c.OnCodecKernel = func(k CodecKernel) {
					mu.Lock()
					launches = append(launches, k)
					mu.Unlock()
				}
			})
			defer func() {
				mu.Lock()
				defer mu.Unlock()
				chunk := int64(DefaultCodecChunkBlocks) * gpuCodecShape.BlockBytes()
				if len(launches) != 2 || !launches[0].Encode || launches[1].Encode {
					t.Fatalf("launches reported %+v, want a quantize then a dequantize", launches)
				}
				for _, k := range launches {
					if k.Blocks != DefaultCodecChunkBlocks || k.RawBytes != chunk || k.Elapsed <= 0 {
						t.Errorf("launch %+v, want %d blocks, %d bytes, timed", k, DefaultCodecChunkBlocks, chunk)
					}
					t.Logf("encode %v: %d bytes in %v (%.0f GB/s of bf16)", k.Encode, k.RawBytes, k.Elapsed, float64(k.RawBytes)/k.Elapsed.Seconds()/1e9)
				}
			}()
			if e.CodecKernels() != "cuda" {
				t.Fatalf("CodecKernels() = %q on the GPU, want cuda", e.CodecKernels())
			}
			st, err := r.dev.NewStream(0)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Destroy()
			s := gpuCodecShape
			enc, _ := codec.EncodedBytes(codec.FP8E4M3PerHead, s)
			rng := rand.New(rand.NewPCG(37, 2))
			const n = 40
			perm := rng.Perm(gpuCodecBlocks)
			out, in := make([]Pair, n), make([]Pair, n)
			raws := make([][]byte, n)
			for i := range n {
				raws[i] = make([]byte, s.BlockBytes())
				for k := 0; k < len(raws[i]); k += 2 {
					binary.LittleEndian.PutUint16(raws[i][k:], uint16(math.Float32bits(float32(rng.NormFloat64()*math.Ldexp(1, rng.IntN(20)-10)))>>16))
				}
				r.copyBlock(t, st, int32(perm[i]), raws[i], true)
				out[i] = Pair{GPUBlock: int32(perm[i]), HostSlot: int32(n - 1 - i)}
				in[i] = Pair{GPUBlock: int32(perm[n+i]), HostSlot: int32(n - 1 - i)}
			}
			ctx := context.Background()
			tr, err := e.Offload(ctx, out)
			if err != nil {
				t.Fatal(err)
			}
			if err := tr.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			tr.Release()
			want, back := make([]byte, enc), make([]byte, s.BlockBytes())
			for i, p := range out {
				if err := codec.Encode(codec.FP8E4M3PerHead, s, want, raws[i]); err != nil {
					t.Fatal(err)
				}
				if got := r.host.Slot(p.HostSlot)[:enc]; !bytes.Equal(got, want) {
					t.Fatalf("host slot %d differs from codec.Encode of GPU block %d at byte %d", p.HostSlot, p.GPUBlock, firstDiff(got, want))
				}
			}
			if tr, err = e.Onboard(ctx, in); err != nil {
				t.Fatal(err)
			}
			if err := tr.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			tr.Release()
			got := make([]byte, s.BlockBytes())
			for i, p := range in {
				if err := codec.Encode(codec.FP8E4M3PerHead, s, want, raws[i]); err != nil {
					t.Fatal(err)
				}
				if err := codec.Decode(codec.FP8E4M3PerHead, s, back, want); err != nil {
					t.Fatal(err)
				}
				r.copyBlock(t, st, p.GPUBlock, got, false)
				if !bytes.Equal(got, back) {
					t.Fatalf("GPU block %d differs from codec.Decode(codec.Encode(block)) at byte %d", p.GPUBlock, firstDiff(got, back))
				}
			}
		})
	}
}

// BenchmarkGPUCodec moves 64 blocks of 2 MiB (block-first) per op, out
// (offload), in (onboard) or both at once, with and without the codec;
// the rate is in bf16 bytes (what the GPU holds), so the codec's is
// comparable with the link's. Each op moves 16 or 64 blocks: the time
// between the two is the path's sustained rate, without the fixed cost of
// an op (its issue and its completion). The host slots are the size package stack
// gives them (the stored block rounded up to 4 KiB: 1 MiB + 4 KiB coded),
// and the blocks' GPU blocks and host slots are consecutive ("seq", so
// that their copies merge) or shuffled ("shuf", one copy a block, as a
// cache that has churned). "fp8-2MiB" is the FP8 path with 2 MiB slots,
// the rig of the earlier results (fp8-codec-path-h200.md); "fp8-4groups"
// onboards in 4 groups of layers (Config.CodecLayerGroups) instead of
// whole blocks.
func BenchmarkGPUCodec(b *testing.B) {
	r := newCodecRig(b, "block-first")
	enc := roundUp(mustEncodedBytes(b, gpuCodecShape), 4096)
	for _, c := range []struct {
		name   string
		c      codec.Codec
		slot   int64
		groups int
	}{
		{"none", codec.None, gpuCodecShape.BlockBytes(), 0},
		{"fp8", codec.FP8E4M3PerHead, enc, 0},
		{"fp8-4groups", codec.FP8E4M3PerHead, enc, 4},
		{"fp8-2MiB", codec.FP8E4M3PerHead, gpuCodecShape.BlockBytes(), 0},
	} {
		e := r.engine(b, c.c, func(cfg *Config) { cfg.Host.SlotBytes, cfg.CodecLayerGroups = c.slot, c.groups })
		for _, order := range []string{"seq", "shuf"} {
			for _, way := range []string{"out", "in", "both"} {
				for _, n := range []int{16, 64} {
					b.Run(fmt.Sprintf("%s/%s/%s/%d", c.name, order, way, n), func(b *testing.B) {
						benchCodecWay(b, e, way, order == "shuf", n)
					})
				}
			}
		}
	}
}

func mustEncodedBytes(b testing.TB, s codec.Shape) int64 {
	n, err := codec.EncodedBytes(codec.FP8E4M3PerHead, s)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkGPUCodecRing: the FP8 path's ring shapes, chunk blocks ×
// buffers, one way and both, to choose the defaults by.
func BenchmarkGPUCodecRing(b *testing.B) {
	r := newCodecRig(b, "block-first")
	for _, chunk := range []int{2, 4, 8, 16} {
		for _, bufs := range []int{2, 4} {
			e := r.engine(b, codec.FP8E4M3PerHead, func(c *Config) { c.CodecChunkBlocks, c.CodecBuffers = chunk, bufs })
			for _, way := range []string{"out", "in", "both"} {
				b.Run(fmt.Sprintf("chunk%d/bufs%d/%s", chunk, bufs, way), func(b *testing.B) { benchCodecWay(b, e, way, false, 64) })
			}
		}
	}
}

// benchCodecWay moves n blocks one way or both per op: out from GPU
// blocks (and to host slots) 0..n-1, in from 64..64+n-1, or, shuffled, a
// fixed random permutation of the 128. Beside the mean it reports each
// op's median ("p50-us", which a stray slow op does not move) and the
// median time the Onboard or Offload call took to return ("issue-us").
func benchCodecWay(b *testing.B, e *Engine, way string, shuffled bool, n int) {
	gpu, host := make([]int, gpuCodecBlocks), make([]int, gpuCodecBlocks)
	for i := range gpu {
		gpu[i], host[i] = i, i
	}
	if shuffled {
		rng := rand.New(rand.NewPCG(37, 9))
		rng.Shuffle(len(gpu), func(i, j int) { gpu[i], gpu[j] = gpu[j], gpu[i] })
		rng.Shuffle(len(host), func(i, j int) { host[i], host[j] = host[j], host[i] })
	}
	const half = gpuCodecBlocks / 2
	out, in := make([]Pair, n), make([]Pair, n)
	for i := range n {
		out[i] = Pair{GPUBlock: int32(gpu[i]), HostSlot: int32(host[i])}
		in[i] = Pair{GPUBlock: int32(gpu[half+i]), HostSlot: int32(host[half+i])}
	}
	ctx := context.Background()
	var issued []time.Duration
	run := func(f func(context.Context, []Pair) (*Transfer, error), pairs []Pair, timed bool) {
		start := time.Now()
		tr, err := f(ctx, pairs)
		if err != nil {
			b.Error(err)
			return
		}
		if timed {
			issued = append(issued, time.Since(start))
		}
		if err := tr.Wait(ctx); err != nil {
			b.Error(err)
		}
		<-tr.Done()
		tr.Release()
	}
	offload := func(ctx context.Context, p []Pair) (*Transfer, error) { return e.Offload(ctx, p) }
	raw := int64(n) * gpuCodecShape.BlockBytes()
	b.SetBytes(raw)
	if way == "both" {
		b.SetBytes(2 * raw)
	}
	run(offload, out, false) // warm: the slots hold encoded blocks for the onboards
	run(offload, in, false)
	var ops []time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		switch way {
		case "out":
			run(offload, out, true)
		case "in":
			run(e.Onboard, in, true)
		default:
			var wg sync.WaitGroup
			wg.Go(func() { run(offload, out, false) })
			run(e.Onboard, in, true)
			wg.Wait()
		}
		ops = append(ops, time.Since(start))
	}
	b.ReportMetric(float64(median(ops).Microseconds()), "p50-us")
	b.ReportMetric(float64(median(issued).Microseconds()), "issue-us")
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
