package nvme

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// Slot header layout, little-endian. magic and version sit at fixed offsets
// in every format version, so that a future version can recognise this one.
//
//	 0 magic       uint64  headerMagic
//	 8 headerSum   uint64  xxhash64 of bytes [16, 80+4*tokenCount)
//	16 version     uint16  formatVersion
//	18 flags       uint16  0
//	20 tokenCount  uint32
//	24 seq         uint64  store-wide write sequence number
//	32 key         uint64
//	40 parent      uint64
//	48 salt        uint64
//	56 payloadLen  uint32
//	60 slot        uint32  slot index within its file
//	64 file        uint32  file index within the store
//	68 position    uint32  the block's position in its prefix (0: first)
//	72 payloadSum  uint64  xxhash64 of the payload
//	80 tokens      [tokenCount]uint32
const (
	headerMagic      uint64 = 0x31454d564e54564b // "KVTNVME1"
	formatVersion    uint16 = 2                  // 2: position at 68 (1 had 0 there)
	headerFixedBytes        = 80
)

// header is the decoded form of a slot header.
type header struct {
	version    uint16
	seq        uint64
	key        uint64
	parent     uint64
	salt       uint64
	position   uint32
	payloadLen uint32
	slot       uint32
	file       uint32
	payloadSum uint64
	tokens     []uint32
}

// headerBytes is the encoded size of a header with n tokens.
func headerBytes(n int) int { return headerFixedBytes + 4*n }

// encodeHeader writes h into dst and zeroes the rest of dst. dst MUST be at
// least headerBytes(len(h.tokens)) long.
func encodeHeader(dst []byte, h *header) {
	n := headerBytes(len(h.tokens))
	le := binary.LittleEndian
	le.PutUint64(dst[0:], headerMagic)
	le.PutUint16(dst[16:], h.version)
	le.PutUint16(dst[18:], 0)
	le.PutUint32(dst[20:], uint32(len(h.tokens)))
	le.PutUint64(dst[24:], h.seq)
	le.PutUint64(dst[32:], h.key)
	le.PutUint64(dst[40:], h.parent)
	le.PutUint64(dst[48:], h.salt)
	le.PutUint32(dst[56:], h.payloadLen)
	le.PutUint32(dst[60:], h.slot)
	le.PutUint32(dst[64:], h.file)
	le.PutUint32(dst[68:], h.position)
	le.PutUint64(dst[72:], h.payloadSum)
	for i, t := range h.tokens {
		le.PutUint32(dst[headerFixedBytes+4*i:], t)
	}
	clear(dst[n:])
	le.PutUint64(dst[8:], xxhash.Sum64(dst[16:n]))
}

// errEmptySlot means the header region was never written (or was
// invalidated); it is not corruption.
var errEmptySlot = fmt.Errorf("%w: empty slot", ErrNotFound)

// decodeHeader parses src into h, reusing h.tokens' storage. It accepts at
// most maxTokens tokens. It returns errEmptySlot for a zero magic,
// ErrFormatVersion for another version and ErrCorrupt for anything else
// that is wrong; it never panics, whatever src holds.
func decodeHeader(src []byte, h *header, maxTokens int) error {
	if len(src) < headerFixedBytes {
		return fmt.Errorf("%w: header region is %d bytes, want at least %d", ErrCorrupt, len(src), headerFixedBytes)
	}
	le := binary.LittleEndian
	magic := le.Uint64(src[0:])
	if magic == 0 {
		return errEmptySlot
	}
	if magic != headerMagic {
		return fmt.Errorf("%w: bad magic %#x", ErrCorrupt, magic)
	}
	if v := le.Uint16(src[16:]); v != formatVersion {
		return fmt.Errorf("%w: version %d, this build reads %d", ErrFormatVersion, v, formatVersion)
	}
	nt := le.Uint32(src[20:])
	if int64(nt) > int64(maxTokens) || headerBytes(int(nt)) > len(src) {
		return fmt.Errorf("%w: header claims %d tokens, at most %d fit", ErrCorrupt, nt, maxTokens)
	}
	n := headerBytes(int(nt))
	if sum := xxhash.Sum64(src[16:n]); sum != le.Uint64(src[8:]) {
		return fmt.Errorf("%w: header checksum %#x, stored %#x", ErrCorrupt, sum, le.Uint64(src[8:]))
	}
	if f := le.Uint16(src[18:]); f != 0 {
		return fmt.Errorf("%w: unknown header flags %#x", ErrCorrupt, f)
	}
	h.version = formatVersion
	h.seq = le.Uint64(src[24:])
	h.key = le.Uint64(src[32:])
	h.parent = le.Uint64(src[40:])
	h.salt = le.Uint64(src[48:])
	h.payloadLen = le.Uint32(src[56:])
	h.slot = le.Uint32(src[60:])
	h.file = le.Uint32(src[64:])
	h.position = le.Uint32(src[68:])
	h.payloadSum = le.Uint64(src[72:])
	h.tokens = h.tokens[:0]
	for i := range int(nt) {
		h.tokens = append(h.tokens, le.Uint32(src[headerFixedBytes+4*i:]))
	}
	return nil
}
