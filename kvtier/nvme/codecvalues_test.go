package nvme_test

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"

	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/nvme"
)

// The store keeps a block's codec as a plain byte, documented by
// reference to kvtier/codec: the values must be codec.Codec's, and one
// written as codec.FP8E4M3PerHead reads back as it, and only as it.
func TestCodecValuesAreKvtierCodecs(t *testing.T) {
	if codec.None != 0 || codec.FP8E4M3PerHead != 1 || codec.NumCodecs != 2 {
		t.Fatalf("kvtier/codec numbers None %d, FP8E4M3PerHead %d (%d codecs); nvme's docs say 0 and 1: update BlockMeta.Codec's doc",
			codec.None, codec.FP8E4M3PerHead, codec.NumCodecs)
	}
	s, err := nvme.Open(nvme.Config{Dirs: []string{t.TempDir()}, SlotsPerFile: 4, BlockBytes: 8192, MaxTokens: 16, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	buf, err := unix.Mmap(-1, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	slot, err := s.Allocate()
	if err != nil {
		t.Fatal(err)
	}
	meta := nvme.BlockMeta{Key: 7, Codec: uint8(codec.FP8E4M3PerHead)}
	if err := s.Write(context.Background(), slot, meta, buf[:4096]); err != nil {
		t.Fatal(err)
	}
	for _, want := range []codec.Codec{codec.FP8E4M3PerHead, codec.None} {
		ops := []nvme.ReadOp{{Slot: slot, Dst: buf, WantCodec: uint8(want)}}
		if err := s.ReadBatch(context.Background(), ops); err != nil {
			t.Fatal(err)
		}
		if ok := ops[0].Err == nil; ok != (want == codec.FP8E4M3PerHead) || ok && codec.Codec(ops[0].Meta.Codec) != want {
			t.Fatalf("read wanting %v: codec %v, %v", want, codec.Codec(ops[0].Meta.Codec), ops[0].Err)
		}
	}
}
