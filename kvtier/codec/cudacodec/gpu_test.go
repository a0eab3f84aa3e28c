package cudacodec

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/gputest"
	"kvtier.dev/kvtier/codec"
)

// The tests and benchmarks named Cu* run on a real GPU; without a driver
// they skip, unless KVTIER_REQUIRE_GPU=1. KVTIER_CODEC_PTX=FILE loads FILE
// instead of the embedded kernels/fp8.ptx (a fresh nvcc build, before it
// is committed). On the GPU machine:
//
//	go test -c -o .gpu/cudacodec.test ./kvtier/codec/cudacodec
//	KVTIER_REQUIRE_GPU=1 ./.gpu/cudacodec.test -test.v -test.run Cu -test.bench Cu -test.benchtime 20x

func loadKernels(t testing.TB, dev cudastream.Device) *Kernels {
	t.Helper()
	var k *Kernels
	var err error
	if f := os.Getenv("KVTIER_CODEC_PTX"); f != "" {
		ptx, rerr := os.ReadFile(f)
		if rerr != nil {
			t.Fatal(rerr)
		}
		k, err = load(dev, f, string(ptx))
	} else {
		k, err = Load(dev)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Close(); err != nil {
			t.Error(err)
		}
	})
	return k
}

// cuRig is the GPU, the kernels loaded on it and a stream, for a test.
func cuRig(t *testing.T) (cudastream.Device, *Kernels, cudastream.Stream) {
	t.Helper()
	dev := gputest.Device(t)
	k := loadKernels(t, dev)
	st, err := dev.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Destroy() })
	return dev, k, st
}

func devAlloc(t testing.TB, dev cudastream.Device, n int64) cudastream.DevicePtr {
	t.Helper()
	p, err := dev.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Free(p) })
	return p
}

// fill writes n bf16 values from gen.
func fill(b []byte, gen func(i int) uint16) {
	for i := 0; 2*i < len(b); i++ {
		binary.LittleEndian.PutUint16(b[2*i:], gen(i))
	}
}

func bf16(f float64) uint16 { return uint16(math.Float32bits(float32(f)) >> 16) }

// inputs are the blocks the kernels must encode exactly as Go does.
func inputs(r *rand.Rand) map[string]func(i int) uint16 {
	return map[string]func(i int) uint16{
		"normal":      func(i int) uint16 { return bf16(r.NormFloat64()) },
		"wide":        func(i int) uint16 { return bf16(math.Ldexp(r.NormFloat64(), r.IntN(80)-40)) },
		"any bits":    func(i int) uint16 { return uint16(r.Uint32()) }, // Inf, NaN, subnormals, everything
		"zeros":       func(i int) uint16 { return uint16(i%2) << 15 },  // +0 and -0
		"subnormals":  func(i int) uint16 { return uint16(r.IntN(0x80)) | uint16(i%2)<<15 },
		"spike":       func(i int) uint16 { return [2]uint16{bf16(1e-3 * float64(i%17)), bf16(3e4)}[min(1, i%4099/4098)] },
		"tiny amax":   func(i int) uint16 { return bf16(float64(i%7-3) * 0x1p-101) },
		"inf and nan": func(i int) uint16 { return [6]uint16{0x7F80, 0xFF80, 0x7FC0, 0xFFC1, bf16(2), bf16(-0.25)}[i%6] },
	}
}

// TestCuQuantizeMatchesGo compares the kernels' bytes with codec.Encode
// and codec.Decode's, for several shapes, several blocks per launch, and
// inputs from plain to adversarial.
func TestCuQuantizeMatchesGo(t *testing.T) {
	dev, k, st := cuRig(t)
	r := rand.New(rand.NewPCG(37, 6))
	shapes := []codec.Shape{llama8B, shp(1, 1, 1, 1, 16), shp(3, 2, 5, 3, 48), shp(2, 1, 7, 1, 576), shp(2, 2, 16, 40, 64)}
	for _, s := range shapes {
		for name, gen := range inputs(r) {
			t.Run(fmt.Sprintf("%d-%d-%d-%d-%d/%s", s.Layers, s.Parts, s.Tokens, s.Heads, s.HeadDim, name), func(t *testing.T) {
				compareOnGPU(t, dev, k, st, s, 3, gen)
			})
		}
	}
}

func compareOnGPU(t *testing.T, dev cudastream.Device, k *Kernels, st cudastream.Stream, s codec.Shape, blocks int, gen func(int) uint16) {
	raw, enc := s.BlockBytes(), mustEncoded(t, s)
	src := make([]byte, int64(blocks)*raw)
	fill(src, gen)
	want := make([]byte, int64(blocks)*enc)
	back := make([]byte, len(src))
	for b := range int64(blocks) {
		if err := codec.Encode(codec.FP8E4M3PerHead, s, want[b*enc:(b+1)*enc], src[b*raw:(b+1)*raw]); err != nil {
			t.Fatal(err)
		}
		if err := codec.Decode(codec.FP8E4M3PerHead, s, back[b*raw:(b+1)*raw], want[b*enc:(b+1)*enc]); err != nil {
			t.Fatal(err)
		}
	}
	dSrc, dEnc, dBack := devAlloc(t, dev, int64(len(src))), devAlloc(t, dev, int64(len(want))), devAlloc(t, dev, int64(len(back)))
	gotEnc := bytes.Repeat([]byte{0xA5}, len(want))
	gotBack := bytes.Repeat([]byte{0xA5}, len(back))
	if err := st.CopyHtoD(dEnc, gotEnc); err != nil { // poison: the kernel must write every byte
		t.Fatal(err)
	}
	for _, err := range []error{
		st.CopyHtoD(dSrc, src),
		k.Quantize(st, s, dEnc, dSrc, blocks),
		st.CopyDtoH(gotEnc, dEnc),
		st.CopyHtoD(dEnc, want), // decode the Go encoding, so the two halves are tested apart
		k.Dequantize(st, s, dBack, dEnc, blocks),
		st.CopyDtoH(gotBack, dBack),
		st.Synchronize(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if i := firstDiff(gotEnc, want); i >= 0 {
		t.Fatalf("quantize: byte %d of %d differs: GPU %#02x, Go %#02x (block %d, offset %d in it; scales are the first %d bytes)",
			i, len(want), gotEnc[i], want[i], int64(i)/enc, int64(i)%enc, s.ScaleBytes())
	}
	if i := firstDiff(gotBack, back); i >= 0 {
		t.Fatalf("dequantize: byte %d of %d differs: GPU %#02x, Go %#02x", i, len(back), gotBack[i], back[i])
	}
}

func mustEncoded(t testing.TB, s codec.Shape) int64 {
	n, err := codec.EncodedBytes(codec.FP8E4M3PerHead, s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestCuDequantizeAnyCodes decodes random codes (NaN codes included)
// under random valid scales and compares with codec.Decode.
func TestCuDequantizeAnyCodes(t *testing.T) {
	dev, k, st := cuRig(t)
	r := rand.New(rand.NewPCG(37, 7))
	s := shp(4, 2, 16, 8, 128)
	enc := make([]byte, mustEncoded(t, s))
	for i := range enc {
		enc[i] = byte(r.Uint32())
	}
	for g := range s.Layers * s.Parts * s.Heads {
		sc := float32(math.Ldexp(r.Float64(), r.IntN(258)-130)) // subnormal to 2^127: past MaxFloat32/448, still finite
		binary.LittleEndian.PutUint32(enc[4*g:], math.Float32bits(sc))
	}
	want := make([]byte, s.BlockBytes())
	if err := codec.Decode(codec.FP8E4M3PerHead, s, want, enc); err != nil {
		t.Fatal(err)
	}
	dEnc, dOut := devAlloc(t, dev, int64(len(enc))), devAlloc(t, dev, int64(len(want)))
	got := make([]byte, len(want))
	for _, err := range []error{st.CopyHtoD(dEnc, enc), k.Dequantize(st, s, dOut, dEnc, 1), st.CopyDtoH(got, dOut), st.Synchronize()} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("byte %d differs: GPU %#02x, Go %#02x", i, got[i], want[i])
	}
}

// TestCuBlocksMatchGo: QuantizeBlocks and DequantizeBlocks over a
// layer-first KV region (each part of a block apart from the others),
// naming more blocks than one launch carries, in a shuffled order, give
// codec.Encode's and codec.Decode's bytes; blocks not named keep theirs,
// and a dequantize of some layers writes those layers only.
func TestCuBlocksMatchGo(t *testing.T) {
	dev, k, st := cuRig(t)
	r := rand.New(rand.NewPCG(37, 8))
	for _, s := range []codec.Shape{llama8B, shp(3, 2, 5, 3, 48), shp(2, 1, 7, 1, 576)} {
		t.Run(fmt.Sprintf("%d-%d-%d-%d-%d", s.Layers, s.Parts, s.Tokens, s.Heads, s.HeadDim), func(t *testing.T) {
			compareBlocksOnGPU(t, dev, k, st, s, r)
		})
	}
}

func compareBlocksOnGPU(t *testing.T, dev cudastream.Device, k *Kernels, st cudastream.Stream, s codec.Shape, r *rand.Rand) {
	const total, named = 48, 37 // named > launchBlocks: several launches
	lps, raw, enc := s.Layers*s.Parts, s.BlockBytes(), mustEncoded(t, s)
	part := raw / int64(lps)
	region := make([]byte, total*raw) // layer-first: part p of block b at (p*total + b)*part
	fill(region, func(int) uint16 { return bf16(math.Ldexp(r.NormFloat64(), r.IntN(16)-8)) })
	dRegion, dEnc := devAlloc(t, dev, int64(len(region))), devAlloc(t, dev, named*enc)
	table := make([]byte, 8*lps)
	for p := range lps {
		binary.LittleEndian.PutUint64(table[8*p:], uint64(dRegion)+uint64(int64(p)*total*part))
	}
	dTable := devAlloc(t, dev, int64(len(table)))
	l := Layout{Table: dTable, Stride: part}
	blocks := make([]int32, named)
	for i, b := range r.Perm(total)[:named] {
		blocks[i] = int32(b)
	}
	block := func(mem []byte, b int32) []byte { // GPU block b gathered, in (layer, part) order
		out := make([]byte, 0, raw)
		for p := range int64(lps) {
			out = append(out, mem[(p*total+int64(b))*part:][:part]...)
		}
		return out
	}
	want, back := make([]byte, named*enc), make([]byte, named*raw)
	for i, b := range blocks {
		if err := codec.Encode(codec.FP8E4M3PerHead, s, want[int64(i)*enc:][:enc], block(region, b)); err != nil {
			t.Fatal(err)
		}
		if err := codec.Decode(codec.FP8E4M3PerHead, s, back[int64(i)*raw:][:raw], want[int64(i)*enc:][:enc]); err != nil {
			t.Fatal(err)
		}
	}
	gotEnc := bytes.Repeat([]byte{0xA5}, len(want))
	poison := bytes.Repeat([]byte{0x5A}, len(region))
	gotRegion := make([]byte, len(region))
	for _, err := range []error{
		st.CopyHtoD(dTable, table),
		st.CopyHtoD(dEnc, gotEnc), // poison: the kernel must write every byte
		st.CopyHtoD(dRegion, region),
		k.QuantizeBlocks(st, s, dEnc, l, blocks),
		st.CopyDtoH(gotEnc, dEnc),
		st.CopyHtoD(dEnc, want), // decode the Go encoding, so the two halves are tested apart
		st.CopyHtoD(dRegion, poison),
		// Layers 1.. first, as an onboard's later group: layer 0 stays.
		k.DequantizeBlocks(st, s, l, dEnc, blocks, Layers{1, s.Layers - 1}),
		st.CopyDtoH(gotRegion, dRegion),
		st.Synchronize(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if i := firstDiff(gotEnc, want); i >= 0 {
		t.Fatalf("QuantizeBlocks: byte %d of %d differs: GPU %#02x, Go %#02x (the %d-th block named, GPU block %d, offset %d)",
			i, len(want), gotEnc[i], want[i], int64(i)/enc, blocks[int64(i)/enc], int64(i)%enc)
	}
	layer0 := int64(s.Parts) * part // a block's layer 0, in (layer, part) order
	for i, b := range blocks {
		got, w := block(gotRegion, b), back[int64(i)*raw:][:raw]
		if !bytes.Equal(got[:layer0], block(poison, b)[:layer0]) {
			t.Fatalf("DequantizeBlocks of layers 1..%d wrote layer 0 of GPU block %d", s.Layers-1, b)
		}
		if j := firstDiff(got[layer0:], w[layer0:]); j >= 0 {
			t.Fatalf("DequantizeBlocks of layers 1..%d: GPU block %d (the %d-th named), byte %d past layer 0 differs", s.Layers-1, b, i, j)
		}
	}
	for _, err := range []error{
		k.DequantizeBlocks(st, s, l, dEnc, blocks, Layers{0, 1}),
		st.CopyDtoH(gotRegion, dRegion),
		st.Synchronize(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	isNamed := make(map[int32]bool)
	for i, b := range blocks {
		isNamed[b] = true
		if j := firstDiff(block(gotRegion, b), back[int64(i)*raw:][:raw]); j >= 0 {
			t.Fatalf("DequantizeBlocks: GPU block %d (the %d-th named), byte %d of its (layer, part) order differs", b, i, j)
		}
	}
	for b := range int32(total) {
		if !isNamed[b] && !bytes.Equal(block(gotRegion, b), block(poison, b)) {
			t.Fatalf("DequantizeBlocks wrote GPU block %d, which it was not given", b)
		}
	}
}
