package codec

import (
	"errors"
	"testing"
)

// fuzzShape picks a small shape from four fuzz bytes.
func fuzzShape(a, b, c, d uint8) Shape {
	return Shape{Layers: 1 + int(a%3), Parts: 1 + int(b%2), Tokens: 1 + int(c%5), Heads: 1 + int(d%3), HeadDim: 16 * (1 + int(d/3%2))}
}

// FuzzDecode decodes arbitrary bytes: no panic, and an error only of the
// documented classes (a wrong size, or a corrupt scale).
func FuzzDecode(f *testing.F) {
	s := fuzzShape(1, 1, 1, 1)
	good := make([]byte, encodedBytes(FP8E4M3PerHead, s))
	for i := range good {
		good[i] = byte(i * 31)
	}
	f.Add(uint8(1), uint8(1), uint8(1), uint8(1), good)
	f.Add(uint8(0), uint8(0), uint8(0), uint8(0), []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, a, b, c, d uint8, src []byte) {
		s := fuzzShape(a, b, c, d)
		dst := make([]byte, s.BlockBytes())
		err := Decode(FP8E4M3PerHead, s, dst, src)
		switch {
		case int64(len(src)) != encodedBytes(FP8E4M3PerHead, s):
			if !errors.Is(err, ErrSize) {
				t.Fatalf("Decode of %d bytes for %+v: %v, want ErrSize", len(src), s, err)
			}
		case err != nil && !errors.Is(err, ErrCorrupt):
			t.Fatalf("Decode of %d bytes for %+v: %v, want nil or ErrCorrupt", len(src), s, err)
		}
	})
}

// FuzzEncodeDecode encodes arbitrary bf16 bytes and checks the round trip
// against the format's error bound and special-value rules.
func FuzzEncodeDecode(f *testing.F) {
	f.Add(uint8(2), uint8(1), uint8(4), uint8(4), []byte{0x80, 0x3f, 0x80, 0x7f, 0xc0, 0xff, 0x01, 0x00})
	f.Add(uint8(0), uint8(0), uint8(0), uint8(0), []byte{0x7f, 0x7f, 0, 0})
	f.Fuzz(func(t *testing.T, a, b, c, d uint8, data []byte) {
		s := fuzzShape(a, b, c, d)
		if len(data) == 0 {
			return
		}
		src := make([]byte, s.BlockBytes())
		for i := range src {
			src[i] = data[i%len(data)] ^ byte(i/len(data)) // the input, repeated and varied
		}
		checkRoundTrip(t, s, src)
	})
}
