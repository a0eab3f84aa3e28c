package nvme

import (
	"bytes"
	"testing"
)

var (
	fuzzKey    = []byte("0123456789abcdef0123456789abcdef")
	fuzzDirKey = []byte("a directory's key of 32 bytes...")
	otherDir   = []byte("another directory's key of 32 b.")
)

// fuzzSums is the checksum of a store in fuzzDirKey's directory, with
// Config.ChecksumKey fuzzKey when keyed.
func fuzzSums(keyed bool) *checksum {
	if keyed {
		return newChecksum(fuzzDirKey, fuzzKey)
	}
	return newChecksum(fuzzDirKey, nil)
}

func FuzzDecodeHeader(f *testing.F) {
	for _, keyed := range []bool{false, true} {
		cs := fuzzSums(keyed)
		for i, n := range []int{0, 3, 16} {
			b := make([]byte, 512)
			h := header{version: formatVersion, seq: 9, key: 1, parent: 2, salt: 3, position: 6, payloadLen: 4096,
				slot: 5, file: 1, payloadSum: 77, codec: uint8(i % 2), tokens: tokensFor(4, n)}
			encodeHeader(b, &h, cs)
			f.Add(b, keyed)
			old := bytes.Clone(b)
			old[16] = 0
			f.Add(old, keyed)
			f.Add(b[:headerFixedBytes+2], keyed)
		}
	}
	f.Add(make([]byte, 512), false)
	f.Add([]byte("KVTNVME1"), true)
	f.Fuzz(func(t *testing.T, src []byte, keyed bool) {
		cs := fuzzSums(keyed)
		var h header
		if err := decodeHeader(src, &h, 16, cs); err != nil {
			return
		}
		if len(h.tokens) > 16 {
			t.Fatalf("decoded %d tokens, limit 16", len(h.tokens))
		}
		n := headerBytes(len(h.tokens))
		again := make([]byte, n)
		encodeHeader(again, &h, cs)
		if !bytes.Equal(again, src[:n]) {
			t.Fatalf("decode then encode changed the header:\n%x\n%x", src[:n], again)
		}
		// The other checksum never accepts what this one did.
		if err := decodeHeader(src, &h, 16, fuzzSums(!keyed)); err == nil {
			t.Fatalf("a header accepted with keyed = %v is accepted with keyed = %v too", keyed, !keyed)
		}
		// Nor does another directory's.
		if !keyed {
			if err := decodeHeader(src, &h, 16, newChecksum(otherDir, nil)); err == nil {
				t.Fatal("a header accepted under one directory's key is accepted under another's")
			}
		}
	})
}

// FuzzDecodeSuper: whatever the first bytes of a slab file hold, the
// superblock decoder returns an error or a superblock that encodes back to
// the same bytes; it never panics.
func FuzzDecodeSuper(f *testing.F) {
	b := make([]byte, superBytes)
	encodeSuper(b, &superblock{version: superVersion, fileIndex: 1, fileCount: 2, slotsPerFile: 16,
		blockBytes: 8192, maxTokens: 16, alignBytes: 512, label: "tiny seed=1"})
	f.Add(b)
	flipped := bytes.Clone(b)
	flipped[30] ^= 1
	f.Add(flipped)
	f.Add(make([]byte, superBytes))
	f.Add([]byte("KVTSLB1"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, src []byte) {
		sb, err := decodeSuper(src)
		if err != nil || sb.version != superVersion {
			return // version 2 is read, never written
		}
		again := make([]byte, superBytes)
		encodeSuper(again, &sb)
		if !bytes.Equal(again, src[:superBytes]) {
			t.Fatalf("decode then encode changed the superblock:\n%x\n%x", src[:superBytes], again)
		}
	})
}
