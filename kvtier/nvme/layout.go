package nvme

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// geometry is the on-disk layout of every slab file:
//
//	[superblock: superBytes][slot 0][slot 1]...[slot SlotsPerFile-1]
//	slot = [header region: hdrBytes][payload region: payloadRegion]
//
// Every region is a multiple of the layout unit: the direct-I/O alignment, but at
// least 4 KiB, so that each header and payload starts on a direct-I/O
// boundary and on the 4 KiB physical sector of current NVMe drives (a 512e
// drive would otherwise read-modify-write the sectors that slots share).
type geometry struct {
	alignBytes    int // direct-I/O alignment of buffers and lengths
	hdrBytes      int
	payloadRegion int
	slotBytes     int64
	superBytes    int64
	fileBytes     int64
	slotsPerFile  int
}

func roundUp(n, a int64) int64 { return (n + a - 1) / a * a }

func newGeometry(cfg *Config, alignBytes int) geometry {
	unit := max(alignBytes, 4096)
	a := int64(unit)
	g := geometry{alignBytes: alignBytes, slotsPerFile: cfg.SlotsPerFile,
		hdrBytes:      int(roundUp(int64(headerBytes(cfg.MaxTokens)), a)),
		payloadRegion: int(roundUp(int64(cfg.BlockBytes), a)),
		superBytes:    a}
	g.slotBytes = int64(g.hdrBytes) + int64(g.payloadRegion)
	g.fileBytes = g.superBytes + g.slotBytes*int64(cfg.SlotsPerFile)
	return g
}

// split returns the file index and the slot index within the file.
func (g *geometry) split(slot Slot) (file, idx int) {
	return int(slot) / g.slotsPerFile, int(slot) % g.slotsPerFile
}

// slotOffset is the file offset of slot idx's header.
func (g *geometry) slotOffset(idx int) int64 { return g.superBytes + int64(idx)*g.slotBytes }

// Superblock layout, little-endian, at offset 0 of each slab file:
//
//	 0 magic        uint64 superMagic
//	 8 sum          uint64 xxhash64 of bytes [16, superBytes)
//	16 version      uint32 superVersion
//	20 fileIndex    uint32
//	24 fileCount    uint32
//	28 slotsPerFile uint32
//	32 blockBytes   uint32
//	36 maxTokens    uint32
//	40 alignBytes   uint32
//	44 labelLen     uint32 bytes of label in use
//	48 model        [32]byte SHA-256 of Config.Model
//	80 label        [160]byte Config.Model's first bytes, zero-padded
//
// Version 2 (which recorded no model) ended at byte 48 with a zero
// reserved field where labelLen is; decodeSuper reads it too, so that
// Open can clear such a file's slots rather than fail.
const (
	superMagic     uint64 = 0x31424c5354564b // "KVTSLB1"
	superBytes            = 240
	superV2Bytes          = 48
	superVersion   uint32 = 3 // the superblock's own layout; slot headers have formatVersion
	maxLabelBytes         = 160
	superV2Version uint32 = 2
)

type superblock struct {
	version, fileIndex, fileCount, slotsPerFile, blockBytes, maxTokens, alignBytes uint32
	// model is the SHA-256 of the Config.Model the file was written for,
	// label its first bytes (for the log); zero and "" for version 2.
	model [32]byte
	label string
}

// modelDigest is what a superblock records of model.
func modelDigest(model string) ([32]byte, string) {
	label := model
	if len(label) > maxLabelBytes {
		label = label[:maxLabelBytes]
	}
	return sha256.Sum256([]byte(model)), label
}

func encodeSuper(dst []byte, sb *superblock) {
	le := binary.LittleEndian
	clear(dst[:superBytes])
	le.PutUint64(dst[0:], superMagic)
	label := sb.label[:min(len(sb.label), maxLabelBytes)]
	for i, v := range []uint32{sb.version, sb.fileIndex, sb.fileCount, sb.slotsPerFile, sb.blockBytes, sb.maxTokens, sb.alignBytes, uint32(len(label))} {
		le.PutUint32(dst[16+4*i:], v)
	}
	copy(dst[48:80], sb.model[:])
	copy(dst[80:], label)
	le.PutUint64(dst[8:], xxhash.Sum64(dst[16:superBytes]))
}

// decodeSuper parses the superblock at the start of src, of version 3 or
// 2. It never panics, whatever src holds: a short src, a wrong magic or
// checksum, a label longer than its field or not zero-padded, and a
// non-zero reserved field of version 2 are ErrCorrupt, all zeroes is
// errEmptySlot.
func decodeSuper(src []byte) (superblock, error) {
	le := binary.LittleEndian
	if len(src) < superV2Bytes {
		return superblock{}, fmt.Errorf("%w: superblock is %d bytes, want %d", ErrCorrupt, len(src), superBytes)
	}
	if le.Uint64(src[0:]) == 0 && le.Uint64(src[8:]) == 0 {
		return superblock{}, errEmptySlot
	}
	if m := le.Uint64(src[0:]); m != superMagic {
		return superblock{}, fmt.Errorf("%w: superblock magic %#x", ErrCorrupt, m)
	}
	end := superBytes
	if le.Uint32(src[16:]) == superV2Version {
		end = superV2Bytes
	}
	if len(src) < end {
		return superblock{}, fmt.Errorf("%w: superblock is %d bytes, want %d", ErrCorrupt, len(src), end)
	}
	if sum := xxhash.Sum64(src[16:end]); sum != le.Uint64(src[8:]) {
		return superblock{}, fmt.Errorf("%w: superblock checksum %#x, stored %#x", ErrCorrupt, sum, le.Uint64(src[8:]))
	}
	var v [8]uint32
	for i := range v {
		v[i] = le.Uint32(src[16+4*i:])
	}
	sb := superblock{version: v[0], fileIndex: v[1], fileCount: v[2], slotsPerFile: v[3], blockBytes: v[4], maxTokens: v[5], alignBytes: v[6]}
	if sb.version == superV2Version {
		if v[7] != 0 {
			return superblock{}, fmt.Errorf("%w: superblock reserved field %#x, want 0", ErrCorrupt, v[7])
		}
		return sb, nil
	}
	n := v[7]
	if n > maxLabelBytes {
		return superblock{}, fmt.Errorf("%w: superblock label of %d bytes, at most %d fit", ErrCorrupt, n, maxLabelBytes)
	}
	for _, b := range src[80+n : superBytes] {
		if b != 0 {
			return superblock{}, fmt.Errorf("%w: superblock label is not zero-padded", ErrCorrupt)
		}
	}
	copy(sb.model[:], src[48:80])
	sb.label = string(src[80 : 80+n])
	return sb, nil
}

// mismatch names the first field in which the file's recorded geometry
// differs from want, or returns nil. The model is not geometry: see
// Store.checkSuper.
func (sb superblock) mismatch(want superblock) error {
	type field struct {
		name      string
		got, want uint32
	}
	for _, f := range []field{
		{"Dirs × FilesPerDir (file count)", sb.fileCount, want.fileCount},
		{"Dirs order (file index)", sb.fileIndex, want.fileIndex},
		{"SlotsPerFile", sb.slotsPerFile, want.slotsPerFile},
		{"BlockBytes", sb.blockBytes, want.blockBytes},
		{"MaxTokens", sb.maxTokens, want.maxTokens},
		{"direct-I/O alignment (file system)", sb.alignBytes, want.alignBytes},
	} {
		if f.got != f.want {
			return fmt.Errorf("written with %s = %d, Config gives %d", f.name, f.got, f.want)
		}
	}
	return nil
}
