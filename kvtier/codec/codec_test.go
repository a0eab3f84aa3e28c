package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
)

// llama8B is llama-3.1-8b's block of 16 tokens: 2 MiB as bf16.
var llama8B = Shape{Layers: 32, Parts: 2, Tokens: 16, Heads: 8, HeadDim: 128}

func TestEncodedBytes(t *testing.T) {
	cases := []struct {
		c    Codec
		s    Shape
		want int64
	}{
		{None, llama8B, 2 << 20},
		{FP8E4M3PerHead, llama8B, 32*2*8*4 + 1<<20},
		// One group: 4 bytes of scale padded to 16.
		{FP8E4M3PerHead, Shape{1, 1, 1, 1, 16}, 16 + 16},
		// 3 groups: 12 bytes padded to 16; MLA-like head of 576.
		{FP8E4M3PerHead, Shape{3, 1, 2, 1, 576}, 16 + 3*2*576},
	}
	for _, c := range cases {
		got, err := EncodedBytes(c.c, c.s)
		if err != nil || got != c.want {
			t.Errorf("EncodedBytes(%s, %+v) = %d, %v; want %d", c.c, c.s, got, err, c.want)
		}
	}
}

func TestShapeErrors(t *testing.T) {
	cases := []struct {
		s     Shape
		field string
	}{
		{Shape{0, 2, 16, 8, 128}, "Layers"}, {Shape{1025, 2, 16, 8, 128}, "Layers"},
		{Shape{32, 3, 16, 8, 128}, "Parts"}, {Shape{32, 0, 16, 8, 128}, "Parts"},
		{Shape{32, 2, 0, 8, 128}, "Tokens"}, {Shape{32, 2, 1<<16 + 1, 8, 128}, "Tokens"},
		{Shape{32, 2, 16, 0, 128}, "Heads"}, {Shape{32, 2, 16, 1025, 128}, "Heads"},
		{Shape{32, 2, 16, 8, 0}, "HeadDim"}, {Shape{32, 2, 16, 8, 120}, "HeadDim"}, {Shape{32, 2, 16, 8, 1040}, "HeadDim"},
		{Shape{1024, 2, 1 << 16, 1024, 1024}, "bytes as bf16"},
	}
	for _, c := range cases {
		_, err := EncodedBytes(FP8E4M3PerHead, c.s)
		if !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("EncodedBytes(%+v) = %v, want ErrShape naming %s", c.s, err, c.field)
		}
	}
}

func TestCodecIDs(t *testing.T) {
	for c := range Codec(NumCodecs) {
		got, err := ParseCodec(c.String())
		if err != nil || got != c {
			t.Errorf("ParseCodec(%q) = %v, %v", c.String(), got, err)
		}
	}
	if None != 0 || FP8E4M3PerHead != 1 {
		t.Fatalf("codec ids changed: they are stored in headers")
	}
	if _, err := ParseCodec("fp4"); !errors.Is(err, ErrCodec) || !strings.Contains(err.Error(), `"fp4"`) {
		t.Errorf("ParseCodec(fp4) = %v, want ErrCodec naming it", err)
	}
	if err := Codec(7).Check(); !errors.Is(err, ErrCodec) || !strings.Contains(err.Error(), "id 7") {
		t.Errorf("Codec(7).Check() = %v, want ErrCodec naming id 7", err)
	}
	if _, err := EncodedBytes(Codec(2), llama8B); !errors.Is(err, ErrCodec) {
		t.Errorf("EncodedBytes(Codec(2)) = %v, want ErrCodec", err)
	}
}

// TestBadInputWritesNothing: every error of Encode and Decode leaves dst
// as it was.
func TestBadInputWritesNothing(t *testing.T) {
	s := Shape{2, 2, 4, 2, 16}
	raw, enc := int(s.BlockBytes()), int(encodedBytes(FP8E4M3PerHead, s))
	corrupt := make([]byte, enc)
	binary.LittleEndian.PutUint32(corrupt[4*5:], math.Float32bits(float32(math.NaN())))
	negative := make([]byte, enc)
	binary.LittleEndian.PutUint32(negative[4*7:], math.Float32bits(-1))
	infinite := make([]byte, enc)
	binary.LittleEndian.PutUint32(infinite[0:], 0x7F800000)
	cases := []struct {
		name     string
		decode   bool
		c        Codec
		s        Shape
		dst, src int
		srcBytes []byte
		want     error
		says     string
	}{
		{"encode unknown codec", false, Codec(9), s, enc, raw, nil, ErrCodec, "id 9"},
		{"encode bad shape", false, FP8E4M3PerHead, Shape{2, 2, 4, 2, 8}, enc, raw, nil, ErrShape, "HeadDim"},
		{"encode short src", false, FP8E4M3PerHead, s, enc, raw - 2, nil, ErrSize, "src is"},
		{"encode long dst", false, FP8E4M3PerHead, s, enc + 1, raw, nil, ErrSize, "dst is"},
		{"encode none wrong dst", false, None, s, enc, raw, nil, ErrSize, "dst is"},
		{"decode unknown codec", true, Codec(200), s, raw, enc, nil, ErrCodec, "id 200"},
		{"decode bad shape", true, FP8E4M3PerHead, Shape{2, 2, 4, 0, 16}, raw, enc, nil, ErrShape, "Heads"},
		{"decode short src", true, FP8E4M3PerHead, s, raw, enc - 16, nil, ErrSize, "src is"},
		{"decode short dst", true, FP8E4M3PerHead, s, raw - 1, enc, nil, ErrSize, "dst is"},
		{"decode NaN scale", true, FP8E4M3PerHead, s, raw, enc, corrupt, ErrCorrupt, "layer 1 part 0 head 1"},
		{"decode negative scale", true, FP8E4M3PerHead, s, raw, enc, negative, ErrCorrupt, "layer 1 part 1 head 1"},
		{"decode infinite scale", true, FP8E4M3PerHead, s, raw, enc, infinite, ErrCorrupt, "layer 0 part 0 head 0"},
	}
	for _, c := range cases {
		dst := bytes.Repeat([]byte{0xA5}, c.dst)
		src := c.srcBytes
		if src == nil {
			src = make([]byte, c.src)
		}
		var err error
		if c.decode {
			err = Decode(c.c, c.s, dst, src)
		} else {
			err = Encode(c.c, c.s, dst, src)
		}
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: got %v, want %v naming %q", c.name, err, c.want, c.says)
		}
		if !bytes.Equal(dst, bytes.Repeat([]byte{0xA5}, c.dst)) {
			t.Errorf("%s: dst was written", c.name)
		}
	}
}

func TestNoneCopies(t *testing.T) {
	s := Shape{1, 2, 3, 1, 16}
	src := make([]byte, s.BlockBytes())
	for i := range src {
		src[i] = byte(i * 7)
	}
	enc := make([]byte, s.BlockBytes())
	dec := make([]byte, s.BlockBytes())
	if err := Encode(None, s, enc, src); err != nil {
		t.Fatal(err)
	}
	if err := Decode(None, s, dec, enc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dec, src) || !bytes.Equal(enc, src) {
		t.Fatal("codec None changed the bytes")
	}
}
