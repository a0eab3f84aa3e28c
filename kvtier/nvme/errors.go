package nvme

import "errors"

// Sentinels, for errors.Is. Errors returned by the Store wrap one or more of
// them together with the detail (slot, file, errno).
var (
	// ErrNotFound means the slot or key holds no readable block. Every read
	// that fails for a reason tied to the stored block (corruption, I/O error)
	// also matches ErrNotFound: to the caller it is a miss.
	ErrNotFound = errors.New("nvme: block not found")
	// ErrCorrupt means a slot failed verification (header or payload
	// checksum, magic, identity). The slot was dropped and counted.
	ErrCorrupt = errors.New("nvme: corrupt slot")
	// ErrFormatVersion means a slot header was written by another format
	// version. Such slots are dropped and counted at Open.
	ErrFormatVersion = errors.New("nvme: slot header from another format version")
	// ErrCodec, wrapped with ErrNotFound, means a read named another codec
	// (ReadOp.WantCodec) than the block's (BlockMeta.Codec): to that
	// caller the block is a miss. The block stays readable in its own.
	ErrCodec = errors.New("nvme: block stored in another codec")
	// ErrIO means a read, write or sync failed in the kernel or returned
	// short. The errno, when there is one, is in the chain too.
	ErrIO = errors.New("nvme: I/O error")
	// ErrBusy means the slot has an I/O in flight.
	ErrBusy = errors.New("nvme: slot busy")
	// ErrFull means no free slot is left.
	ErrFull = errors.New("nvme: no free slot")
	// ErrKeyExists means the key is already stored in another slot; free that
	// slot first.
	ErrKeyExists = errors.New("nvme: key already stored in another slot")
	// ErrInvalid means an argument was out of range; nothing was changed.
	ErrInvalid = errors.New("nvme: invalid argument")
	// ErrMisaligned means a buffer does not meet the direct-I/O alignment.
	ErrMisaligned = errors.New("nvme: buffer not aligned for direct I/O")
	// ErrClosed means the Store was closed.
	ErrClosed = errors.New("nvme: store closed")
	// ErrConfig means a Config field is invalid or disagrees with the slab
	// files on disk.
	ErrConfig = errors.New("nvme: bad config")
	// ErrUnsafeDir means a directory of Config.Dirs, or a file in it, could
	// be changed by someone other than this process's user: the directory is
	// a symbolic link, owned by another user or writable by group or
	// others, its parent could be changed by another user, a file in it is
	// a symbolic link or not a regular file of this user, or a slab or key
	// file may be read or written by group or others. Open refuses it.
	ErrUnsafeDir = errors.New("nvme: directory not safe for the tier")
	// ErrLocked means another open Store, in this process or another,
	// holds the directory's lock file; the error names the holder's pid.
	ErrLocked = errors.New("nvme: directory in use by another store")
)
