package nvme

import (
	"fmt"
	"math"
)

// IOMode chooses between direct and buffered I/O.
type IOMode int

const (
	// ModeAuto probes O_DIRECT at Open and falls back to buffered I/O
	// (with fadvise) where the file system refuses it.
	ModeAuto IOMode = iota
	// ModeDirect requires O_DIRECT; Open fails where it is refused.
	ModeDirect
	// ModeBuffered uses the page cache, with POSIX_FADV_DONTNEED after each
	// I/O so that the tier does not duplicate itself in host memory.
	ModeBuffered
	// NumIOModes counts the modes.
	NumIOModes
)

func (m IOMode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeDirect:
		return "direct"
	case ModeBuffered:
		return "buffered"
	}
	return fmt.Sprintf("IOMode(%d)", int(m))
}

// Config describes a Store. The slab geometry (FilesPerDir, SlotsPerFile,
// BlockBytes, MaxTokens and the number of Dirs) is recorded in each slab
// file; reopening with a different geometry fails with ErrConfig naming the
// field, and changes nothing on disk.
type Config struct {
	// Dirs are the directories that hold slab files, one per drive to spread
	// the load, e.g. {"/mnt/nvme0/kvtier", "/mnt/nvme1/kvtier"}. Open creates
	// a missing one with mode 0700 (its parent must exist) and refuses one
	// that another user owns or that group or others may write, one whose
	// parent another user could change, and a path whose last component is
	// a symbolic link: whoever can write them could plant blocks that the
	// GPU then loads, or choose where the slab files go. Name the directory
	// itself (a link higher up the path is followed). Each is locked
	// (kvtier.lock in it) while the Store is open, and keeps its header key
	// in kvtier.key. Slots are handed out round-robin over the files.
	Dirs []string
	// FilesPerDir is the number of slab files in each directory (0 means 1).
	FilesPerDir int
	// SlotsPerFile is the number of block slots in each slab file. With
	// BlockBytes = 1 MiB, SlotsPerFile = 65536 makes 64 GiB files.
	SlotsPerFile int
	// BlockBytes is the largest payload a slot holds, e.g. 1 << 20 for a
	// 16-token block of a model with 64 KiB of KV per token. Each slot takes
	// a header plus BlockBytes, each rounded up to the direct-I/O alignment.
	BlockBytes int
	// MaxTokens is the largest number of token ids a header stores (0 stores
	// none: the block manager keeps tokens elsewhere). 16 tokens add 64 bytes.
	MaxTokens int
	// Mode picks direct or buffered I/O; the default probes.
	Mode IOMode
	// Durable makes Write sync the payload before writing the header and
	// sync the header before returning (two fdatasync calls per vectored
	// write). Without it a block may be lost on power failure, but a wrong
	// one is still never served.
	Durable bool
	// Workers bounds the I/O in flight. Each worker blocks an OS thread in
	// pread/pwrite; 0 means 16, about the queue depth one NVMe drive needs
	// for full bandwidth with 1 MiB I/Os. Use 16 per drive for several.
	Workers int
	// MaxIOBytes caps one vectored I/O over adjacent slots (0 means 8 MiB).
	// A single slot is always read or written in one I/O whatever its size.
	MaxIOBytes int
	// Model names the model whose KV the tier holds: the weights (a digest
	// of their files, or the seed of seeded ones), the shapes, the KV dtype
	// and the tokenizer, in one text, e.g. "weights=sha256:9f2c… layers=32
	// kv_heads=8 head_dim=128 dtype=bf16 tokenizer=sha256:1b7e…"
	// (kvtier/stack builds it from Options.Model). Each slab file records
	// its SHA-256 and first 160 bytes. A file written for another model
	// (or by a version that recorded none) has its slots cleared at Open,
	// before anything is read from it, and then records this one;
	// Info.Cleared says which files and for what model they had been
	// written, so that the caller can log it. KV computed by other weights
	// is wrong KV, even when every checksum holds.
	Model string
	// Reformat lets Open empty and format afresh a slab file it cannot use
	// as it is: one whose superblock does not decode (damaged, or never a
	// kvtier file), that was written with another geometry (SlotsPerFile,
	// BlockBytes, MaxTokens, the directories, the file system's alignment)
	// or superblock version, or that group or others may read or write
	// (its mode becomes 0600: whoever could write it may have planted
	// blocks, so none is kept). Each is counted in
	// Stats.SuperblocksRewritten and its blocks are lost. It also replaces
	// a directory's kvtier.key that others may read, or of another size
	// (the blocks summed under the old key are dropped). Without it such a
	// file fails Open with ErrConfig (ErrUnsafeDir for a mode) naming the
	// file and the field, and nothing is changed.
	Reformat bool
	// ChecksumKey, if set (at least 16 bytes, e.g. 32 random bytes kept
	// outside the directory), keys the payload checksums too (the headers'
	// are keyed anyway, by the directory's kvtier.key): they become
	// HMAC-SHA256 under it, cut to 64 bits. A block written without the key
	// (by a store without it, or planted by someone who can write the slab
	// files) then fails its check and is dropped, never served.
	// Use it when anyone but this user could write the directory or the
	// drive (a shared host, a directory restored from elsewhere, a disk
	// image); without it the checksums (XXH3-64) catch damage but not a
	// forger. It costs CPU: HMAC-SHA256 runs at about 1.2 GB/s a core with
	// SHA instructions (3.3 ms per 4 MiB block on the 2-core dev VM),
	// against about 15 GB/s for XXH3. The key is part of the format: a
	// store opened with another key, or none, drops the blocks as corrupt
	// (and clears them on disk, as any corrupt slot).
	ChecksumKey []byte
	// VerifyPayloadOnOpen reads every payload at Open to check its checksum
	// (slow: the whole tier is read). Without it Open checks the headers and
	// every Read checks its payload.
	VerifyPayloadOnOpen bool
	// Progress, if set, is called during the scan at Open after each chunk
	// of slots, from one goroutine at a time.
	Progress func(RecoverProgress)
	// WrapFile, if set, wraps each slab file after it is opened; tests use it
	// to inject faults. It MUST return a File that forwards to f.
	WrapFile func(path string, f File) File
}

// RecoverProgress reports how far the scan at Open has come.
type RecoverProgress struct {
	SlotsScanned, SlotsTotal int
	Recovered, Dropped       int
}

const (
	defaultWorkers    = 16
	defaultMaxIOBytes = 8 << 20
	maxBlockBytes     = 1 << 30
	maxTokensLimit    = 1 << 16
)

// withDefaults validates c and fills its defaults. Errors name the field.
func (c Config) withDefaults() (Config, error) {
	bad := func(field, format string, args ...any) (Config, error) {
		return c, fmt.Errorf("%w: Config.%s %s", ErrConfig, field, fmt.Sprintf(format, args...))
	}
	if len(c.Dirs) == 0 {
		return bad("Dirs", "is empty: name at least one directory")
	}
	for i, d := range c.Dirs {
		if d == "" {
			return bad("Dirs", "[%d] is empty", i)
		}
		for j := range i {
			if c.Dirs[j] == d {
				return bad("Dirs", "[%d] repeats %q", i, d)
			}
		}
	}
	if c.FilesPerDir < 0 || c.FilesPerDir > 1024 {
		return bad("FilesPerDir", "= %d, want 0..1024", c.FilesPerDir)
	}
	if c.FilesPerDir == 0 {
		c.FilesPerDir = 1
	}
	if c.SlotsPerFile <= 0 || c.SlotsPerFile > math.MaxInt32 {
		return bad("SlotsPerFile", "= %d, want 1..%d", c.SlotsPerFile, math.MaxInt32)
	}
	if total := int64(len(c.Dirs)) * int64(c.FilesPerDir) * int64(c.SlotsPerFile); total >= math.MaxUint32 {
		return bad("SlotsPerFile", "= %d gives %d slots in all, want fewer than %d", c.SlotsPerFile, total, uint32(math.MaxUint32))
	}
	if c.BlockBytes <= 0 || c.BlockBytes > maxBlockBytes {
		return bad("BlockBytes", "= %d, want 1..%d", c.BlockBytes, maxBlockBytes)
	}
	if c.MaxTokens < 0 || c.MaxTokens > maxTokensLimit {
		return bad("MaxTokens", "= %d, want 0..%d", c.MaxTokens, maxTokensLimit)
	}
	if c.Mode < 0 || c.Mode >= NumIOModes {
		return bad("Mode", "= %d, want ModeAuto, ModeDirect or ModeBuffered", int(c.Mode))
	}
	if c.Workers < 0 || c.Workers > 4096 {
		return bad("Workers", "= %d, want 0..4096", c.Workers)
	}
	if c.Workers == 0 {
		c.Workers = defaultWorkers
	}
	if n := len(c.ChecksumKey); n > 0 && n < minChecksumKeyBytes {
		return bad("ChecksumKey", "is %d bytes, want none or at least %d", n, minChecksumKeyBytes)
	}
	if c.MaxIOBytes < 0 {
		return bad("MaxIOBytes", "= %d, want >= 0", c.MaxIOBytes)
	}
	if c.MaxIOBytes == 0 {
		c.MaxIOBytes = defaultMaxIOBytes
	}
	return c, nil
}
