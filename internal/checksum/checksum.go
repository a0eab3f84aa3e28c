// Package checksum computes the 64-bit sums that kvtier's stored blocks carry
// (NVMe slot headers, remote values): XXH3-64 without a key, or HMAC-SHA256
// under a key, cut to its first 64 bits. Keyed, a header or payload written
// by someone without the key fails its check, whatever they can write.
package checksum

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"

	"github.com/zeebo/xxh3"
)

// MinKeyBytes is the shortest key the packages that take one accept.
const MinKeyBytes = 16

// Sum computes checksums. Unkeyed it is XXH3-64, which runs at the speed
// memory delivers the bytes; keyed it is a MAC. It is safe for concurrent
// use and allocates nothing per call.
type Sum struct {
	keyed bool
	macs  sync.Pool // of *mac
}

type mac struct {
	h   hash.Hash
	out [sha256.Size]byte
}

// New returns a Sum keyed with key, or unkeyed when key is empty. It copies
// key.
func New(key []byte) *Sum {
	c := &Sum{keyed: len(key) > 0}
	if c.keyed {
		k := append([]byte(nil), key...)
		c.macs.New = func() any { return &mac{h: hmac.New(sha256.New, k)} }
	}
	return c
}

// Keyed reports whether c is a MAC under a key.
func (c *Sum) Keyed() bool { return c.keyed }

// Of returns the checksum of b.
func (c *Sum) Of(b []byte) uint64 {
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
