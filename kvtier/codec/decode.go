package codec

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Decode writes src, a block of shape s encoded with c (EncodedBytes(c, s)
// bytes), into dst as bf16 (s.BlockBytes() bytes). It allocates nothing.
// On a bad codec, shape or buffer length, or a scale that is negative,
// infinite or NaN (ErrCorrupt, naming the layer, part and head), it
// returns an error and writes nothing. Any other bytes decode to some
// block: integrity is the tiers' checksums' job. src and dst MUST NOT
// overlap.
func Decode(c Codec, s Shape, dst, src []byte) error {
	if err := checkBuffers("Decode", c, s, dst, src, s.BlockBytes(), encodedBytes(c, s)); err != nil {
		return err
	}
	if c == None {
		copy(dst, src)
		return nil
	}
	if err := checkScales(s, src); err != nil {
		return err
	}
	n := s.partValues()
	scales, codes := src[:s.ScaleBytes()], src[s.ScaleBytes():]
	for lp := range s.Layers * s.Parts {
		decodePart(s, dst[2*lp*n:2*(lp+1)*n], scales[4*lp*s.Heads:4*(lp+1)*s.Heads], codes[lp*n:(lp+1)*n])
	}
	return nil
}

// checkScales rejects an encoded block with a scale Encode cannot write.
func checkScales(s Shape, src []byte) error {
	for g := range s.groups() {
		f := math.Float32frombits(binary.LittleEndian.Uint32(src[4*g:]))
		if !(f >= 0 && f <= math.MaxFloat32) {
			head, lp := g%s.Heads, g/s.Heads
			return fmt.Errorf("codec: Decode %s: %w: scale of layer %d part %d head %d is %v (byte offset %d)",
				FP8E4M3PerHead, ErrCorrupt, lp/s.Parts, lp%s.Parts, head, f, 4*g)
		}
	}
	return nil
}

// decodePart decodes one (layer, part).
func decodePart(s Shape, dst, scales, codes []byte) {
	d, h := s.HeadDim, s.Heads
	for i := 0; i < len(codes); i += d {
		head := (i / d) % h
		scale := math.Float32frombits(binary.LittleEndian.Uint32(scales[4*head:]))
		for k, c := range codes[i : i+d] {
			binary.LittleEndian.PutUint16(dst[2*(i+k):], float32ToBF16(float32(e4m3Values[c]*scale)))
		}
	}
}
