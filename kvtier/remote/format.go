package remote

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"kvtier.dev/internal/checksum"
)

// A block is stored as 1+n values under keys that share one hash tag, so
// that Redis Cluster puts them in one slot (one shard) and reads them in
// one round trip:
//
//	<prefix>{<key as 16 hex digits>}h     the header (HeaderBytes)
//	<prefix>{<key as 16 hex digits>}0     payload bytes [0, PartBytes)
//	<prefix>{<key as 16 hex digits>}1     payload bytes [PartBytes, 2*PartBytes)
//	...
//
// The header, little-endian:
//
//	0   magic "KVRB"
//	4   format version (uint16)
//	6   flags (uint8): bit 0 set when the checksums are keyed
//	7   codec (uint8): the payload's codec (BlockMeta.Codec)
//	8   checksum of bytes 16..HeaderBytes
//	16  block key
//	24  parent key
//	32  salt digest: checksum of the salt's 8 bytes
//	40  position in the prefix (uint32)
//	44  token count (uint32)
//	48  token digest: checksum of the salt and the token ids
//	56  payload bytes
//	64  payload checksum
//
// The salt and the token ids are stored as digests only: the header
// verifies them without telling a reader what they are.
//
// Version 2 added the codec byte; version 1 had a uint16 flags field at 6
// whose byte 7 was always zero, and its headers are read as codec None,
// which their payloads are. A version-1 reader refuses a version-2 header
// (another format version: a corrupt value, deleted), so it never takes
// an encoded payload for bf16.
const (
	// HeaderBytes is the size of a block's header value.
	HeaderBytes   = 72
	formatVersion = 2
	// formatV1 is the version before codecs, still read.
	formatV1  = 1
	flagKeyed = 1
)

var magic = [4]byte{'K', 'V', 'R', 'B'}

// BlockMeta names a block: what a read must find in its header.
type BlockMeta struct {
	// Key is the block's chained key; Parent its predecessor's (0 first).
	Key, Parent uint64
	// Salt is the tenant's, model's or adapter's secret (kvtier.Salt).
	Salt uint64
	// Position is the block's index in its prefix.
	Position int
	// Tokens are the block's token ids; nil when the caller knows keys
	// only (traces), whose hits are then as strong as the keys.
	Tokens []int32
	// Codec names the payload's encoding, as a kvtier/codec.Codec value
	// (0 None: the bf16 bytes the GPU holds; 1 FP8E4M3PerHead). Put
	// records it in the header without interpreting it; Get serves a
	// block only when its header names the codec asked for.
	Codec uint8
}

type header struct {
	keyed                     bool
	codec                     uint8
	key, parent, saltSum      uint64
	position, tokens          uint32
	tokenSum, payload, paySum uint64
}

// digests computes the salt and token digests of m; buf is scratch.
func digests(sum *checksum.Sum, m *BlockMeta, buf []byte) (salt, tokens uint64, _ []byte) {
	n := 8 + 4*len(m.Tokens)
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	binary.LittleEndian.PutUint64(buf, m.Salt)
	salt = sum.Of(buf[:8])
	for i, t := range m.Tokens {
		binary.LittleEndian.PutUint32(buf[8+4*i:], uint32(t))
	}
	return salt, sum.Of(buf), buf
}

func encodeHeader(dst []byte, h *header, sum *checksum.Sum) {
	le := binary.LittleEndian
	copy(dst[0:4], magic[:])
	le.PutUint16(dst[4:], formatVersion)
	var flags byte
	if h.keyed {
		flags = flagKeyed
	}
	dst[6], dst[7] = flags, h.codec
	le.PutUint64(dst[16:], h.key)
	le.PutUint64(dst[24:], h.parent)
	le.PutUint64(dst[32:], h.saltSum)
	le.PutUint32(dst[40:], h.position)
	le.PutUint32(dst[44:], h.tokens)
	le.PutUint64(dst[48:], h.tokenSum)
	le.PutUint64(dst[56:], h.payload)
	le.PutUint64(dst[64:], h.paySum)
	le.PutUint64(dst[8:], sum.Of(dst[16:HeaderBytes]))
}

// decodeHeader checks src's framing and checksum and fills h.
func decodeHeader(src []byte, h *header, sum *checksum.Sum) error {
	le := binary.LittleEndian
	if len(src) != HeaderBytes {
		return fmt.Errorf("header is %d bytes, want %d", len(src), HeaderBytes)
	}
	if [4]byte(src[0:4]) != magic {
		return fmt.Errorf("header magic %q, want %q", src[0:4], magic[:])
	}
	v := le.Uint16(src[4:])
	if v != formatVersion && v != formatV1 {
		return fmt.Errorf("header format version %d, want %d (or %d)", v, formatVersion, formatV1)
	}
	keyed := src[6]&flagKeyed != 0
	if keyed != sum.Keyed() {
		return fmt.Errorf("header keyed=%v, this tier keyed=%v (Config.ChecksumKey differs)", keyed, sum.Keyed())
	}
	if got := sum.Of(src[16:HeaderBytes]); got != le.Uint64(src[8:]) {
		return fmt.Errorf("header checksum %#x, stored %#x", got, le.Uint64(src[8:]))
	}
	c := uint8(0) // version 1: codec None
	if v == formatVersion {
		c = src[7]
	}
	*h = header{keyed: keyed, codec: c, key: le.Uint64(src[16:]), parent: le.Uint64(src[24:]),
		saltSum: le.Uint64(src[32:]), position: le.Uint32(src[40:]), tokens: le.Uint32(src[44:]),
		tokenSum: le.Uint64(src[48:]), payload: le.Uint64(src[56:]), paySum: le.Uint64(src[64:])}
	return nil
}

// keyNames returns the header key and the part keys of block key k.
func keyNames(prefix string, k uint64, parts int) []string {
	base := make([]byte, 0, len(prefix)+20)
	base = append(base, prefix...)
	base = append(base, '{')
	var hex [16]byte
	s := strconv.AppendUint(hex[:0], k, 16)
	for range 16 - len(s) {
		base = append(base, '0')
	}
	base = append(base, s...)
	base = append(base, '}')
	names := make([]string, 1+parts)
	names[0] = string(append(base, 'h'))
	for i := range parts {
		names[1+i] = string(strconv.AppendInt(base, int64(i), 10))
	}
	return names
}
