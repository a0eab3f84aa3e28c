//go:build !linux

package sysio

// Iovec is one entry of a preadv/pwritev vector.
type Iovec struct{}

// EINVAL stands for the errno of a file system that refuses O_DIRECT.
var EINVAL error = ErrNotSupported

func Open(path string, direct bool) (int, error)                         { return -1, ErrNotSupported }
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
