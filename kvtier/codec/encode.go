package codec

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Encode writes src, a block of shape s as bf16 (s.BlockBytes() bytes),
// into dst encoded with c (EncodedBytes(c, s) bytes). It allocates nothing.
// On a bad codec, shape or buffer length it returns an error naming it and
// writes nothing. src and dst MUST NOT overlap.
func Encode(c Codec, s Shape, dst, src []byte) error {
	if err := checkBuffers("Encode", c, s, dst, src, encodedBytes(c, s), s.BlockBytes()); err != nil {
		return err
	}
	if c == None {
		copy(dst, src)
		return nil
	}
	encodeFP8(s, dst, src)
	return nil
}

// checkBuffers checks what Encode and Decode check before they write.
func checkBuffers(op string, c Codec, s Shape, dst, src []byte, dstWant, srcWant int64) error {
	if err := c.Check(); err != nil {
		return fmt.Errorf("codec: %s: %w", op, err)
	}
	if err := s.Validate(); err != nil {
		return fmt.Errorf("codec: %s: %w", op, err)
	}
	if int64(len(src)) != srcWant {
		return fmt.Errorf("codec: %s %s: %w: src is %d bytes, shape %+v needs %d", op, c, ErrSize, len(src), s, srcWant)
	}
	if int64(len(dst)) != dstWant {
		return fmt.Errorf("codec: %s %s: %w: dst is %d bytes, shape %+v needs %d", op, c, ErrSize, len(dst), s, dstWant)
	}
	return nil
}

// encodeFP8 encodes a checked block, one (layer, part) at a time.
func encodeFP8(s Shape, dst, src []byte) {
	n := s.partValues()
	scales, codes := dst[:s.ScaleBytes()], dst[s.ScaleBytes():]
	clear(scales[4*s.groups():])
	for lp := range s.Layers * s.Parts {
		encodePart(s, scales[4*lp*s.Heads:4*(lp+1)*s.Heads], codes[lp*n:(lp+1)*n], src[2*lp*n:2*(lp+1)*n])
	}
}

// encodePart encodes one (layer, part): its heads' scales, then its codes.
func encodePart(s Shape, scales, codes, src []byte) {
	d, h := s.HeadDim, s.Heads
	// Pass 1: each head's amax over the part's tokens.
	var amax [maxHeads]float32
	for i := 0; i < len(codes); i += d {
		head := (i / d) % h
		m := amax[head]
		for k := range d {
			a := math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*(i+k):])&0x7FFF) << 16)
			if a > m && a <= math.MaxFloat32 {
				m = a
			}
		}
		amax[head] = m
	}
	// The scales, and the factors that take a value to the e4m3 range.
	var inv [maxHeads]float32
	for head := range h {
		var scale float32
		if a := amax[head]; a >= MinAmax {
			scale = a / e4m3Max
			inv[head] = e4m3Max / a
		}
		binary.LittleEndian.PutUint32(scales[4*head:], math.Float32bits(scale))
	}
	// Pass 2: the codes.
	for i := 0; i < len(codes); i += d {
		f := inv[(i/d)%h]
		for k := range d {
			x := bf16ToFloat32(binary.LittleEndian.Uint16(src[2*(i+k):]))
			v := float32(x * f)
			if math.IsInf(float64(x), 0) {
				v = x
			}
			codes[i+k] = e4m3FromFloat32(v)
		}
	}
}
