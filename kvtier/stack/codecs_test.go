package stack

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/devmover"
	"kvtier.dev/kvtier/transfer"
)

// simShard's block for the codec: 2 layers of K and V, 4 tokens × 2 heads
// × 64 values of bf16 (1 KiB parts).
var simShape = codec.Shape{Layers: 2, Parts: 2, Tokens: 4, Heads: 2, HeadDim: 64}

// TestOpenCodecErrors: bad codec settings are refused naming the field.
func TestOpenCodecErrors(t *testing.T) {
	sh, _ := simShard(t, 8)
	good := Options{Device: sh.Device, GPU: sh.GPU, BlockTokens: 4, HostBytes: 8 << 12, Logger: slog.New(slog.DiscardHandler),
		Codecs: Codecs{Host: codec.FP8E4M3PerHead, KVHeads: 2}}
	fp8 := codec.FP8E4M3PerHead
	nvme := func(o *Options) { o.NVMeDirs, o.NVMeBytes = []string{t.TempDir()}, 1<<20 }
	for _, tc := range []struct {
		edit func(*Options)
		want string
	}{
		{func(o *Options) { o.Codecs.Host = 9 }, "Options.Codecs.Host"},
		{func(o *Options) { nvme(o); o.Codecs.NVMe = 7 }, "Options.Codecs.NVMe"},
		{func(o *Options) { nvme(o) }, "Options.Codecs.NVMe: none, but Options.Codecs.Host is fp8-e4m3-per-head"},
		{func(o *Options) { nvme(o); o.Codecs.Host, o.Codecs.NVMe = codec.None, fp8 }, "Options.Codecs.NVMe"},
		{func(o *Options) { o.Codecs.NVMe = fp8 }, "Options.Codecs.NVMe: fp8-e4m3-per-head without that tier"},
		{func(o *Options) { o.Codecs.Remote = fp8 }, "Options.Codecs.Remote"},
		{func(o *Options) { o.Codecs.KVHeads = 0 }, "Options.Codecs.KVHeads"},
		{func(o *Options) { o.Codecs.KVHeads = 3 }, "Options.Codecs.KVHeads"},  // 1 KiB parts are not 4 tokens × 3 heads
		{func(o *Options) { o.Codecs.KVHeads = 16 }, "Options.Codecs.KVHeads"}, // heads of 8 values: the codec wants 16 or more
		{func(o *Options) { o.HostBytes = 4096 - 1 }, "Options.HostBytes"},
	} {
		openRefuses(t, good, tc.edit, tc.want)
	}
}

// TestCodecsDoubleTheSlots: with blocks of llama-3.1-8b (2 MiB), the same
// bytes of host and NVMe tier hold twice the blocks, less the scales and
// the host slots' rounding to 4 KiB.
func TestCodecsDoubleTheSlots(t *testing.T) {
	const layers, parts, part = 32, 2, 32 << 10
	base := make([]cudastream.DevicePtr, layers*parts)
	for i := range base {
		base[i] = cudastream.DevicePtr(1<<30 + i*part)
	}
	gpu := transfer.GPULayout{Layers: layers, Parts: parts, PartBytes: part, NumBlocks: 16, BlockStride: layers * parts * part, Base: base}
	dev, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	o := Options{Device: dev, GPU: gpu, BlockTokens: 16, HostBytes: 256 << 20, NVMeDirs: []string{"unused"}, NVMeBytes: 1 << 30}
	plain, err := o.size()
	if err != nil {
		t.Fatal(err)
	}
	o.Codecs = Codecs{Host: codec.FP8E4M3PerHead, NVMe: codec.FP8E4M3PerHead, KVHeads: 8}
	fp8, err := o.size()
	if err != nil {
		t.Fatal(err)
	}
	if plain.hostSlots != 128 || plain.nvmeSlots != 512 {
		t.Fatalf("uncompressed: %d host slots, %d NVMe slots; want 128 and 512", plain.hostSlots, plain.nvmeSlots)
	}
	// 1,048,576 codes + 2,048 bytes of scales: 1,050,624 bytes, 1,052,672
	// as a host slot.
	if fp8.storedBytes != 1050624 || fp8.slotBytes != 1052672 {
		t.Fatalf("fp8: blocks of %d bytes in slots of %d, want 1050624 in 1052672", fp8.storedBytes, fp8.slotBytes)
	}
	if fp8.hostSlots != (256<<20)/1052672 || fp8.nvmeSlots != (1<<30)/1050624 {
		t.Fatalf("fp8: %d host slots, %d NVMe slots; want %d and %d", fp8.hostSlots, fp8.nvmeSlots, (256<<20)/1052672, (1<<30)/1050624)
	}
	if 100*fp8.hostSlots < 198*plain.hostSlots || 100*fp8.nvmeSlots < 198*plain.nvmeSlots {
		t.Errorf("fp8 holds %d host and %d NVMe blocks, against %d and %d: want about twice", fp8.hostSlots, fp8.nvmeSlots, plain.hostSlots, plain.nvmeSlots)
	}
}

// evictPath is where a round trip's blocks go down, tier after tier, and
// the mover's ops that takes, there and back.
type evictPath struct {
	name  string
	tiers []kvtier.Tier
	want  devmover.Stats
}

// TestOpenCodecRoundTrip: blocks written on the GPU go down to the host
// tier, to NVMe (through the bounce slots), or to the host tier and then
// from it to NVMe, and come back to the GPU as
// codec.Decode(codec.Encode(block)) with the codec on, and as they were
// with it off; the host slots hold codec.Encode(block).
func TestOpenCodecRoundTrip(t *testing.T) {
	paths := []evictPath{
		{"gpu-host-gpu", []kvtier.Tier{kvtier.Host}, devmover.Stats{Offloads: 3, Onboards: 3}},
		{"gpu-nvme-gpu", []kvtier.Tier{kvtier.NVMe}, devmover.Stats{BounceWrites: 3, StagedLoads: 3}},
		{"gpu-host-nvme-gpu", []kvtier.Tier{kvtier.Host, kvtier.NVMe}, devmover.Stats{Offloads: 3, NVMeWrites: 3, StagedLoads: 3}},
	}
	for _, c := range []codec.Codec{codec.None, codec.FP8E4M3PerHead} {
		for _, path := range paths {
			t.Run(c.String()+"/"+path.name, func(t *testing.T) {
				codecRoundTrip(t, c, path)
			})
		}
	}
}

func codecRoundTrip(t *testing.T, c codec.Codec, path evictPath) {
	ctx := context.Background()
	sh, region := simShard(t, 8)
	o := Options{Device: sh.Device, GPU: sh.GPU, BlockTokens: 4, HostBytes: 8 << 12, NVMeDirs: []string{t.TempDir()}, NVMeBytes: 8 << 12,
		Logger: slog.New(slog.DiscardHandler), Codecs: Codecs{Host: c, NVMe: c, KVHeads: 2}}
	cache, err := Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cache.Close(); err != nil {
			t.Error(err)
		}
	}()
	if want := map[codec.Codec]string{codec.None: "", codec.FP8E4M3PerHead: "go"}[c]; cache.Engine.CodecKernels() != want {
		t.Errorf("the engine codes with %q, want %q", cache.Engine.CodecKernels(), want)
	}
	st, err := sh.Device.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Destroy()
	blockBytes := sh.GPU.BlockBytes()
	at := func(s kvtier.Slot) cudastream.DevicePtr { return region + cudastream.DevicePtr(int64(s)*blockBytes) }
	rng := rand.New(rand.NewPCG(uint64(c), uint64(len(path.tiers))))
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	var w kvtier.Lease
	if err := cache.Insert(7, prompt, kvtier.GPU, &w); err != nil {
		t.Fatal(err)
	}
	raws := map[kvtier.Key][]byte{}
	for _, b := range w.Blocks {
		raws[b.Key] = make([]byte, blockBytes)
		for i := range raws[b.Key] {
			raws[b.Key][i] = byte(rng.Uint32())
		}
		if err := st.CopyHtoD(at(b.Slot), raws[b.Key]); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := cache.Commit(&w, nil); err != nil {
		t.Fatal(err)
	}
	cache.Release(&w)
	for _, to := range path.tiers {
		if n, err := cache.Evict(ctx, 7, prompt, to); n != 3 || err != nil {
			t.Fatalf("Evict to %v: %d blocks, %v; want 3", to, n, err)
		}
	}
	to := path.tiers[len(path.tiers)-1]
	want := func(raw []byte) (enc, back []byte) {
		if c == codec.None {
			return raw, raw
		}
		enc, back = make([]byte, cache.Mover.BlockBytes()), make([]byte, len(raw))
		if err := codec.Encode(c, simShape, enc, raw); err != nil {
			t.Fatal(err)
		}
		if err := codec.Decode(c, simShape, back, enc); err != nil {
			t.Fatal(err)
		}
		return enc, back
	}
	var l kvtier.Lease
	if err := cache.Lookup(7, prompt, &l); err != nil || l.Len() != 3 {
		t.Fatalf("lookup: %d blocks, %v", l.Len(), err)
	}
	defer cache.Release(&l)
	for _, b := range l.Blocks {
		if b.Tier != to {
			t.Fatalf("block at position %d is in the %v tier, want %v", b.Position, b.Tier, to)
		}
		if enc, _ := want(raws[b.Key]); to == kvtier.Host && !bytes.Equal(cache.Host.Slot(int32(b.Slot))[:len(enc)], enc) {
			t.Fatalf("host slot %d differs from the block as the %s codec encodes it", b.Slot, c)
		}
	}
	if err := cache.Plan(&l); err != nil {
		t.Fatal(err)
	}
	if err := cache.Onboard(&l); err != nil {
		t.Fatal(err)
	}
	if err := cache.Wait(ctx, &l); err != nil {
		t.Fatal(err)
	}
	if st := cache.Mover.Stats(); st != path.want {
		t.Errorf("the mover's ops %+v, want %+v", st, path.want)
	}
	for _, b := range l.Blocks {
		got := make([]byte, blockBytes)
		if err := st.CopyDtoH(got, at(b.GPUSlot)); err != nil {
			t.Fatal(err)
		}
		if err := st.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if _, back := want(raws[b.Key]); !bytes.Equal(got, back) {
			t.Errorf("block at position %d came back from %v to GPU slot %d other than codec %s decodes it", b.Position, to, b.GPUSlot, c)
		}
	}
}
