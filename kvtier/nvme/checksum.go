package nvme

import sumpkg "kvtier.dev/internal/checksum"

// checksum computes the 64-bit sums that slot headers carry: of the header
// itself and of the payload (internal/checksum: XXH3-64, or HMAC-SHA256
// under Config.ChecksumKey cut to 64 bits, so that a header or payload
// written by someone without the key fails its check). The payload is cold
// after DMA, so memory, not the hash, bounds the unkeyed cost. It is safe
// for concurrent use and allocates nothing per call.
type checksum struct{ s *sumpkg.Sum }

// minChecksumKeyBytes is the shortest Config.ChecksumKey accepted.
const minChecksumKeyBytes = sumpkg.MinKeyBytes

func newChecksum(key []byte) *checksum { return &checksum{s: sumpkg.New(key)} }

// sum returns the checksum of b.
func (c *checksum) sum(b []byte) uint64 { return c.s.Of(b) }

// payload returns the checksum of payload b as a header with word-summed
// (flagWordSum) or not says it is computed.
func (c *checksum) payload(b []byte, wordSum bool) uint64 {
	if wordSum {
		return sumpkg.WordSum(b)
	}
	return c.s.Of(b)
}

// flags is what the header's flags field says of this checksum.
func (c *checksum) flags() uint16 {
	if c.s.Keyed() {
		return flagKeyed
	}
	return 0
}
