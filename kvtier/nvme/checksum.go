package nvme

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"

	"github.com/zeebo/xxh3"
)

// checksum computes the 64-bit sums that slot headers carry: of the header
// itself and of the payload. Without a key it is XXH3-64, which runs at
// the speed memory delivers the bytes (the payload is cold after DMA, so
// memory, not the hash, bounds the cost). With Config.ChecksumKey it is
// HMAC-SHA256 under that key, cut to its first 64 bits: a header or payload
// written by someone without the key fails its check, whatever they can
// write. It is safe for concurrent use and allocates nothing per call.
type checksum struct {
	keyed bool
	macs  sync.Pool // of *mac
}

type mac struct {
	h   hash.Hash
	out [sha256.Size]byte
}

// minChecksumKeyBytes is the shortest Config.ChecksumKey accepted.
const minChecksumKeyBytes = 16

func newChecksum(key []byte) *checksum {
	c := &checksum{keyed: len(key) > 0}
	if c.keyed {
		k := append([]byte(nil), key...)
		c.macs.New = func() any { return &mac{h: hmac.New(sha256.New, k)} }
	}
	return c
}

// sum returns the checksum of b.
func (c *checksum) sum(b []byte) uint64 {
	if !c.keyed {
		return xxh3.Hash(b)
	}
	m := c.macs.Get().(*mac)
	m.h.Reset()
	m.h.Write(b)
	v := binary.LittleEndian.Uint64(m.h.Sum(m.out[:0]))
	c.macs.Put(m)
	return v
}

// flags is what the header's flags field says of this checksum.
func (c *checksum) flags() uint16 {
	if c.keyed {
		return flagKeyed
	}
	return 0
}
