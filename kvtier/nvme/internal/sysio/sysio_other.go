//go:build !linux

package sysio

// Iovec is one entry of a preadv/pwritev vector.
type Iovec struct{}

// EINVAL stands for the errno of a file system that refuses O_DIRECT.
var EINVAL error = ErrNotSupported

// ELOOP stands for the errno of an open that met a symbolic link.
var ELOOP error = ErrNotSupported

// Stat is what the tier checks of a file or directory it opened.
type Stat struct {
	UID    uint32
	Perm   uint32
	Sticky bool
	Dir    bool
	Reg    bool
	Size   int64
}

// ENOTDIR stands for the errno of a directory open that met something else.
var ENOTDIR error = ErrNotSupported

// ErrLocked stands for the errno of a lock held elsewhere.
var ErrLocked error = ErrNotSupported

func OpenDir(path string) (int, error)                  { return -1, ErrNotSupported }
func OpenDirAt(dirfd int, name string) (int, error)     { return -1, ErrNotSupported }
func IsLinkAt(dirfd int, name string) bool              { return false }
func MkdirAt(dirfd int, name string, perm uint32) error { return ErrNotSupported }
func Fchmod(fd int, perm uint32) error                  { return ErrNotSupported }
func Truncate(fd int, sizeBytes int64) error            { return ErrNotSupported }
func OpenAt(dirfd int, name string, direct bool) (int, bool, error) {
	return -1, false, ErrNotSupported
}
func UnlinkAt(dirfd int, name string) error                              { return ErrNotSupported }
func Fstat(fd int) (Stat, error)                                         { return Stat{}, ErrNotSupported }
func Geteuid() uint32                                                    { return 0 }
func TryLock(fd int) error                                               { return ErrNotSupported }
func ReplaceContents(fd int, b []byte) error                             { return ErrNotSupported }
func ReadSmall(fd int, buf []byte) (int, error)                          { return 0, ErrNotSupported }
func Fsync(fd int) error                                                 { return ErrNotSupported }
func Close(fd int) error                                                 { return ErrNotSupported }
func Preadv(fd int, iov []Iovec, bufs [][]byte, off int64) (int, error)  { return 0, ErrNotSupported }
func Pwritev(fd int, iov []Iovec, bufs [][]byte, off int64) (int, error) { return 0, ErrNotSupported }
func Fdatasync(fd int) error                                             { return ErrNotSupported }
func Fallocate(fd int, sizeBytes int64) (bool, error)                    { return false, ErrNotSupported }
func Fadvise(fd int, off, length int64, advice Advice) error             { return ErrNotSupported }
func Size(fd int) (int64, error)                                         { return 0, ErrNotSupported }
func DirectIOAlign(fd int) Align                                         { return Align{512, 512, "default"} }
func AllocAligned(sizeBytes int) ([]byte, error)                         { return nil, ErrNotSupported }
func FreeAligned(b []byte) error                                         { return ErrNotSupported }
func ErrnoName(err error) string                                         { return "" }
