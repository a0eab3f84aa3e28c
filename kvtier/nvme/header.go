package nvme

import (
	"encoding/binary"
	"fmt"
)

// Slot header layout, little-endian. magic and version sit at fixed offsets
// in every format version, so that a future version can recognise this one.
//
//	 0 magic       uint64  headerMagic
//	 8 headerSum   uint64  checksum of bytes [16, 80+4*tokenCount)
//	16 version     uint16  formatVersion
//	18 flags       uint8   flagKeyed, flagWordSum or 0
//	19 codec       uint8   the payload's codec (BlockMeta.Codec)
//	20 tokenCount  uint32
//	24 seq         uint64  store-wide write sequence number
//	32 key         uint64
//	40 parent      uint64
//	48 salt        uint64
//	56 payloadLen  uint32
//	60 slot        uint32  slot index within its file
//	64 file        uint32  file index within the store
//	68 position    uint32  the block's position in its prefix (0: first)
//	72 payloadSum  uint64  checksum of the payload
//	80 tokens      [tokenCount]uint32
//
// The header's sum is a MAC under the directory's key, or under
// Config.ChecksumKey (see checksum). The payload's is XXH3-64, or with
// flagKeyed the MAC under Config.ChecksumKey, or with flagWordSum
// internal/checksum's WordSum, which the writer computed (on the GPU,
// WriteOp.WordSummed). A keyed store never writes a word sum.
//
// Byte 19 was the high byte of a uint16 flags field, zero in every header
// written before codecs: such a header reads as codec 0 (None), which its
// payload is, so the format version stayed 4. A build from before reads a
// non-zero codec byte as unknown flags, a corrupt slot, and never serves
// its payload as bf16.
const (
	headerMagic      uint64 = 0x31454d564e54564b // "KVTNVME1"
	formatVersion    uint16 = 4                  // 4: headers keyed (3: XXH3 headers; 2: xxhash64; 1 had no position)
	headerFixedBytes        = 80
	// flagKeyed marks a payload sum keyed with Config.ChecksumKey.
	flagKeyed uint8 = 1
	// flagWordSum marks a payload checksum that is a word sum.
	flagWordSum uint8 = 2
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
	wordSum    bool  // payloadSum is a word sum (flagWordSum)
	codec      uint8 // the payload's codec (BlockMeta.Codec)
	tokens     []uint32
}

// headerBytes is the encoded size of a header with n tokens.
func headerBytes(n int) int { return headerFixedBytes + 4*n }

// encodeHeader writes h into dst, summed with cs, and zeroes the rest of
// dst. dst MUST be at least headerBytes(len(h.tokens)) long.
func encodeHeader(dst []byte, h *header, cs *checksum) {
	n := headerBytes(len(h.tokens))
	le := binary.LittleEndian
	le.PutUint64(dst[0:], headerMagic)
	le.PutUint16(dst[16:], h.version)
	flags := cs.flags()
	if h.wordSum {
		flags |= flagWordSum
	}
	dst[18] = flags
	dst[19] = h.codec
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
	le.PutUint64(dst[8:], cs.header(dst[16:n]))
}

// errEmptySlot means the header region was never written (or was
// invalidated); it is not corruption.
var errEmptySlot = fmt.Errorf("%w: empty slot", ErrNotFound)

// decodeHeader parses src into h, reusing h.tokens' storage, and checks
// its sum with cs. It accepts at most maxTokens tokens. A header summed
// under another key, or whose payload sum is keyed where cs's is not (or
// the reverse), is ErrCorrupt. It returns errEmptySlot for a zero magic,
// ErrFormatVersion for another version and ErrCorrupt for anything else
// that is wrong; it never panics, whatever src holds.
func decodeHeader(src []byte, h *header, maxTokens int, cs *checksum) error {
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
	f := src[18]
	switch keyed := f&flagKeyed != 0; {
	case f&^(flagKeyed|flagWordSum) != 0:
		return fmt.Errorf("%w: unknown header flags %#x", ErrCorrupt, f)
	case keyed && f&flagWordSum != 0:
		return fmt.Errorf("%w: header flags %#x: keyed and word-summed (a keyed store never writes word sums)", ErrCorrupt, f)
	case keyed && !cs.keyed():
		return fmt.Errorf("%w: header summed with a key, and Config.ChecksumKey is empty", ErrCorrupt)
	case !keyed && cs.keyed():
		return fmt.Errorf("%w: header summed without the key of Config.ChecksumKey (written by a store without it, or planted)", ErrCorrupt)
	}
	if sum := cs.header(src[16:n]); sum != le.Uint64(src[8:]) {
		return fmt.Errorf("%w: header checksum %#x, stored %#x (summed under another key: planted, or brought from another directory)", ErrCorrupt, sum, le.Uint64(src[8:]))
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
	h.wordSum = f&flagWordSum != 0
	h.codec = src[19]
	h.tokens = h.tokens[:0]
	for i := range int(nt) {
		h.tokens = append(h.tokens, le.Uint32(src[headerFixedBytes+4*i:]))
	}
	return nil
}
