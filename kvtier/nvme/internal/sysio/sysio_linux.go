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

// ELOOP is the errno of an O_NOFOLLOW open that met a symbolic link.
var ELOOP error = unix.ELOOP

// OpenDir opens the directory at path for use as the base of OpenAt, with
// O_DIRECTORY so that anything else fails with ENOTDIR.
func OpenDir(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, fmt.Errorf("open directory %s: %w", path, err)
		}
		return fd, nil
	}
}

// OpenDirAt opens the directory name, a plain name in the directory dirfd,
// with O_NOFOLLOW: a symbolic link fails with ELOOP (or ENOTDIR), and
// anything but a directory with ENOTDIR.
func OpenDirAt(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, fmt.Errorf("open directory %s: %w", name, err)
		}
		return fd, nil
	}
}

// MkdirAt creates the directory name in the directory dirfd with mode
// perm (less the umask); an existing name is no error.
func MkdirAt(dirfd int, name string, perm uint32) error {
	if err := unix.Mkdirat(dirfd, name, perm); err != nil && err != unix.EEXIST {
		return fmt.Errorf("mkdir %s: %w", name, err)
	}
	return nil
}

// IsLinkAt reports whether name, in the directory dirfd, is a symbolic
// link (false when it does not exist).
func IsLinkAt(dirfd int, name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
}

// ENOTDIR is the errno of a directory open that met something else.
var ENOTDIR error = unix.ENOTDIR

// Fchmod sets fd's permission bits to perm.
func Fchmod(fd int, perm uint32) error {
	if err := unix.Fchmod(fd, perm); err != nil {
		return fmt.Errorf("fchmod: %w", err)
	}
	return nil
}

// Truncate sets fd's size to sizeBytes.
func Truncate(fd int, sizeBytes int64) error {
	if err := unix.Ftruncate(fd, sizeBytes); err != nil {
		return fmt.Errorf("ftruncate: %w", err)
	}
	return nil
}

// OpenAt opens name, a plain name in the directory dirfd, read-write with
// O_NOFOLLOW (a symbolic link fails with ELOOP), creating it with mode 0600
// where it is absent, and with O_DIRECT when direct is true. created says
// whether this call made the file. The error for a file system that refuses
// O_DIRECT is unix.EINVAL.
func OpenAt(dirfd int, name string, direct bool) (fd int, created bool, err error) {
	flags := unix.O_RDWR | unix.O_NOFOLLOW | unix.O_CLOEXEC
	if direct {
		flags |= unix.O_DIRECT
	}
	for {
		// O_EXCL first, so that the call knows whether it made the file.
		fd, err = unix.Openat(dirfd, name, flags|unix.O_CREAT|unix.O_EXCL, 0o600)
		if err == unix.EEXIST {
			fd, err = unix.Openat(dirfd, name, flags, 0)
		} else if err == nil {
			created = true
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, false, fmt.Errorf("open %s: %w", name, err)
		}
		return fd, created, nil
	}
}

// UnlinkAt removes name from the directory dirfd.
func UnlinkAt(dirfd int, name string) error {
	if err := unix.Unlinkat(dirfd, name, 0); err != nil {
		return fmt.Errorf("unlink %s: %w", name, err)
	}
	return nil
}

// Stat is what the tier checks of a file or directory it opened.
type Stat struct {
	UID    uint32
	Perm   uint32 // the permission bits, 0o777 at most
	Sticky bool   // the sticky bit (a directory's: only owners remove names)
	Dir    bool
	Reg    bool
	Size   int64
}

// Fstat describes fd.
func Fstat(fd int) (Stat, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Stat{}, fmt.Errorf("fstat: %w", err)
	}
	return Stat{UID: st.Uid, Perm: st.Mode & 0o777, Sticky: st.Mode&unix.S_ISVTX != 0, Dir: st.Mode&unix.S_IFMT == unix.S_IFDIR,
		Reg: st.Mode&unix.S_IFMT == unix.S_IFREG, Size: st.Size}, nil
}

// Geteuid is the process's effective user id.
func Geteuid() uint32 { return uint32(unix.Geteuid()) }

// ErrLocked is the error of TryLock when another open file holds the lock.
var ErrLocked error = unix.EWOULDBLOCK

// TryLock takes an exclusive flock on fd without waiting. The lock belongs
// to the open file description: another open of the same file, in this
// process or another, fails with ErrLocked until fd is closed.
func TryLock(fd int) error {
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("flock: %w", err)
		}
		return nil
	}
}

// ReplaceContents makes fd's contents b: it truncates fd and writes b at 0.
func ReplaceContents(fd int, b []byte) error {
	if err := unix.Ftruncate(fd, 0); err != nil {
		return fmt.Errorf("ftruncate: %w", err)
	}
	for off := 0; off < len(b); {
		n, err := unix.Pwrite(fd, b[off:], int64(off))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("pwrite: %w", err)
		}
		off += n
	}
	return nil
}

// ReadSmall reads up to len(buf) bytes of fd from offset 0.
func ReadSmall(fd int, buf []byte) (int, error) {
	for {
		n, err := unix.Pread(fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("pread: %w", err)
		}
		return n, nil
	}
}

// Fsync flushes fd, a directory's entries included.
func Fsync(fd int) error {
	for {
		err := unix.Fsync(fd)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("fsync: %w", err)
		}
		return nil
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
