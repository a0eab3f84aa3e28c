//go:build !linux

package sys

import (
	"errors"
	"unsafe"
)

// ErrNotSupported: the pinned allocator's system calls exist on Linux only.
var ErrNotSupported = errors.New("pinned: not supported on this operating system")

func MmapAnon(length uintptr, extraFlags int) (unsafe.Pointer, error) { return nil, ErrNotSupported }
func Munmap(addr unsafe.Pointer, length uintptr) error                { return ErrNotSupported }
func Madvise(addr unsafe.Pointer, length uintptr, advice int) error   { return ErrNotSupported }
func MbindNode(addr unsafe.Pointer, length uintptr, node int) error   { return ErrNotSupported }
func SetVMAAnonName(addr unsafe.Pointer, length uintptr, name string) error {
	return ErrNotSupported
}
func ResidentPages(addr unsafe.Pointer, length uintptr, pageSize uintptr) (int, error) {
	return 0, ErrNotSupported
}
func PinThreadToCPU(cpu int) error         { return ErrNotSupported }
func AllowedCPUs() ([]int, error)          { return nil, ErrNotSupported }
func Mlock(b []byte) error                 { return ErrNotSupported }
func Munlock(b []byte) error               { return ErrNotSupported }
func MemlockLimit() (uint64, error)        { return 0, ErrNotSupported }
func PhysicalMemoryBytes() (uint64, error) { return 0, ErrNotSupported }

var (
	EINVAL = errors.New("EINVAL")
	ENOMEM = errors.New("ENOMEM")
	EPERM  = errors.New("EPERM")
	EAGAIN = errors.New("EAGAIN")
)

const (
	MADV_HUGEPAGE       = 14
	MADV_POPULATE_WRITE = 23
	MAP_HUGETLB         = 0x40000
	MAP_HUGE_2MB        = 0x54000000
)
