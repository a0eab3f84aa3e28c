//go:build linux

package sysio

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// halfLong splits a 64-bit offset into the (low, high) pair that preadv and
// pwritev take; on 64-bit platforms the high word is always 0.
const halfLong = 4 * unsafe.Sizeof(uintptr(0))

// Iovec is one entry of a preadv/pwritev vector.
type Iovec = unix.Iovec

// EINVAL is the errno a file system returns when it refuses O_DIRECT.
var EINVAL error = unix.EINVAL

// Open opens path read-write, creating it with mode 0600, with O_DIRECT when
// direct is true. The error for a file system that refuses O_DIRECT is
// unix.EINVAL.
func Open(path string, direct bool) (int, error) {
	flags := unix.O_RDWR | unix.O_CREAT | unix.O_CLOEXEC
	if direct {
		flags |= unix.O_DIRECT
	}
	for {
		fd, err := unix.Open(path, flags, 0o600)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", path, err)
		}
		return fd, nil
	}
}

// Close closes fd.
func Close(fd int) error {
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}

// Preadv reads into bufs at off with one preadv call (looping on EINTR).
// iov is scratch space with room for len(bufs) entries, so that the call
// allocates nothing.
func Preadv(fd int, iov []Iovec, bufs [][]byte, off int64) (int, error) {
	return vectored(unix.SYS_PREADV, "preadv", fd, iov, bufs, off)
}

// Pwritev writes bufs at off with one pwritev call (looping on EINTR).
func Pwritev(fd int, iov []Iovec, bufs [][]byte, off int64) (int, error) {
	return vectored(unix.SYS_PWRITEV, "pwritev", fd, iov, bufs, off)
}

func vectored(trap uintptr, op string, fd int, iov []Iovec, bufs [][]byte, off int64) (int, error) {
	iov = iov[:0]
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		v := unix.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		iov = append(iov, v)
	}
	if len(iov) == 0 {
		return 0, nil
	}
	for {
		n, _, errno := unix.Syscall6(trap, uintptr(fd),
			uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)),
			uintptr(off), uintptr(uint64(off)>>halfLong>>halfLong), 0)
		runtime.KeepAlive(bufs)
		runtime.KeepAlive(iov)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, fmt.Errorf("%s: %w", op, errno)
		}
		return int(n), nil
	}
}

// Fdatasync flushes fd's data and the metadata needed to read it.
func Fdatasync(fd int) error {
	for {
		err := unix.Fdatasync(fd)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("fdatasync: %w", err)
		}
		return nil
	}
}

// Fallocate reserves [0, sizeBytes) of fd on disk. Where the file system
// does not support fallocate it extends the file with ftruncate instead and
// reports allocated false.
func Fallocate(fd int, sizeBytes int64) (allocated bool, err error) {
	for {
		err = unix.Fallocate(fd, 0, 0, sizeBytes)
		if err == unix.EINTR {
			continue
		}
		break
	}
	if err == unix.EOPNOTSUPP {
		if err := unix.Ftruncate(fd, sizeBytes); err != nil {
			return false, fmt.Errorf("ftruncate: %w", err)
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("fallocate: %w", err)
	}
	return true, nil
}

// Fadvise passes a page-cache hint for [off, off+length).
func Fadvise(fd int, off, length int64, advice Advice) error {
	a := unix.FADV_DONTNEED
	if advice == AdviceWillNeed {
		a = unix.FADV_WILLNEED
	}
	if err := unix.Fadvise(fd, off, length, a); err != nil {
		return fmt.Errorf("fadvise: %w", err)
	}
	return nil
}

// Size returns fd's size in bytes.
func Size(fd int) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("fstat: %w", err)
	}
	return st.Size, nil
}

// DirectIOAlign returns the direct-I/O alignment of fd: STATX_DIOALIGN when
// the kernel and file system report it (Linux 6.1+), else the logical block
// size of the device under the file from sysfs, else 512. Neither figure is
// ever below 512.
func DirectIOAlign(fd int) Align {
	var st unix.Statx_t
	err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st)
	if err == nil && st.Mask&unix.STATX_DIOALIGN != 0 && st.Dio_offset_align != 0 {
		return Align{MemBytes: max(int(st.Dio_mem_align), 512),
			OffsetBytes: max(int(st.Dio_offset_align), 512), Source: "statx"}
	}
	if err == nil {
		if lbs := logicalBlockBytes(st.Dev_major, st.Dev_minor); lbs > 0 {
			return Align{MemBytes: max(lbs, 512), OffsetBytes: max(lbs, 512), Source: "blockdev"}
		}
	}
	return Align{MemBytes: 512, OffsetBytes: 512, Source: "default"}
}

// logicalBlockBytes reads queue/logical_block_size of the device, or of its
// parent when the device is a partition. It returns 0 when neither exists
// (tmpfs, overlay and other devices without a queue).
func logicalBlockBytes(major, minor uint32) int {
	dev := fmt.Sprintf("/sys/dev/block/%d:%d", major, minor)
	for _, p := range []string{filepath.Join(dev, "queue", "logical_block_size"),
		filepath.Join(dev, "..", "queue", "logical_block_size")} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			return n
		}
	}
	return 0
}

// AllocAligned maps sizeBytes of anonymous, page-aligned memory. The caller
// MUST release it with FreeAligned.
func AllocAligned(sizeBytes int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, sizeBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", sizeBytes, err)
	}
	return b, nil
}

// FreeAligned unmaps memory from AllocAligned.
func FreeAligned(b []byte) error {
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("munmap: %w", err)
	}
	return nil
}

// ErrnoName returns the errno name in err's chain ("EIO", "ENOSPC", ...) or
// "" when err carries no errno.
func ErrnoName(err error) string {
	var e unix.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	return ""
}
