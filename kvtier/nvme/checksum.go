package nvme

import sumpkg "kvtier.dev/internal/checksum"

// checksum computes the 64-bit sums that slot headers carry: of the header
// itself and of the payload (internal/checksum). A header is summed with
// HMAC-SHA256 cut to 64 bits, under Config.ChecksumKey or else under its
// directory's key (keyFileName), so that no one who cannot read the key
// writes a header that checks. A payload is summed with XXH3-64, or with
// the HMAC under Config.ChecksumKey, or, written from the GPU, with a word
// sum; the payload's sum lives in the keyed header. The payload is cold
// after DMA, so memory, not the hash, bounds the unkeyed cost. It is safe
// for concurrent use and allocates nothing per call.
type checksum struct{ hdr, pay *sumpkg.Sum }

// minChecksumKeyBytes is the shortest Config.ChecksumKey accepted.
const minChecksumKeyBytes = sumpkg.MinKeyBytes

// newChecksum sums headers under Config.ChecksumKey (key) if set, else
// under the directory's key (dirKey), and payloads under key (unkeyed
// without one).
func newChecksum(dirKey, key []byte) *checksum {
	hk := key
	if len(hk) == 0 {
		hk = dirKey
	}
	return &checksum{hdr: sumpkg.New(hk), pay: sumpkg.New(key)}
}

// header returns the checksum of a header's bytes b.
func (c *checksum) header(b []byte) uint64 { return c.hdr.Of(b) }

// payload returns the checksum of payload b as a header with word-summed
// (flagWordSum) or not says it is computed.
func (c *checksum) payload(b []byte, wordSum bool) uint64 {
	if wordSum {
		return sumpkg.WordSum(b)
	}
	return c.pay.Of(b)
}

// keyed reports whether payloads are summed under Config.ChecksumKey.
func (c *checksum) keyed() bool { return c.pay.Keyed() }

// flags is what the header's flags field says of this checksum.
func (c *checksum) flags() uint8 {
	if c.keyed() {
		return flagKeyed
	}
	return 0
}
