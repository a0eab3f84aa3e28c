// Package sysio wraps, once, the raw system calls of the NVMe tier: vectored
// positional I/O without allocation, fallocate, fdatasync, fadvise and the
// direct-I/O alignment probe. Every call loops on EINTR and returns errors as
// "op: errno" so that callers can test them with errors.Is against unix.Errno.
package sysio

import "errors"

// ErrNotSupported is returned on platforms without these system calls.
var ErrNotSupported = errors.New("sysio: not supported on this platform")

// Advice is a posix_fadvise hint.
type Advice int

const (
	// AdviceDontNeed drops the range from the page cache once written back.
	AdviceDontNeed Advice = iota
	// AdviceWillNeed starts readahead of the range.
	AdviceWillNeed
)

// Align describes the direct-I/O constraints of one file.
type Align struct {
	// MemBytes is the alignment that user buffers must have.
	MemBytes int
	// OffsetBytes is the alignment of file offsets and lengths.
	OffsetBytes int
	// Source names where the figures came from: "statx", "blockdev" or
	// "default".
	Source string
}
