// Package sys wraps, once, the raw Linux system calls the pinned allocator
// needs and golang.org/x/sys/unix does not type for it: mappings addressed by
// pointer, madvise and mbind on address ranges, VMA naming, mincore and thread
// affinity. Each wrapper retries on EINTR and returns errors as "op: cause".
package sys

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ignoringEINTR calls fn until it returns something other than EINTR.
func ignoringEINTR(fn func() error) error {
	for {
		err := fn()
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// MmapAnon maps length bytes of private anonymous memory, read and write,
// with extra flags (MAP_HUGETLB, MAP_NORESERVE...).
func MmapAnon(length uintptr, extraFlags int) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	err := ignoringEINTR(func() error {
		var err error
		p, err = unix.MmapPtr(-1, 0, nil, length, unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|extraFlags)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", length, err)
	}
	return p, nil
}

// Munmap unmaps [addr, addr+length).
func Munmap(addr unsafe.Pointer, length uintptr) error {
	if err := ignoringEINTR(func() error { return unix.MunmapPtr(addr, length) }); err != nil {
		return fmt.Errorf("munmap %#x+%d: %w", uintptr(addr), length, err)
	}
	return nil
}

// Madvise applies advice to [addr, addr+length).
func Madvise(addr unsafe.Pointer, length uintptr, advice int) error {
	err := ignoringEINTR(func() error {
		_, _, e := unix.Syscall(unix.SYS_MADVISE, uintptr(addr), length, uintptr(advice))
		if e != 0 {
			return e
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("madvise(%d) %#x+%d: %w", advice, uintptr(addr), length, err)
	}
	return nil
}

// MbindNode sets the memory policy of [addr, addr+length) to MPOL_BIND on one
// node, so that pages faulted later come from that node.
func MbindNode(addr unsafe.Pointer, length uintptr, node int) error {
	if node < 0 || node >= 1024 {
		return fmt.Errorf("mbind: node %d out of range [0, 1024)", node)
	}
	var mask [1024 / 64]uint64
	mask[node/64] |= 1 << (node % 64)
	err := ignoringEINTR(func() error {
		_, _, e := unix.Syscall6(unix.SYS_MBIND, uintptr(addr), length, unix.MPOL_BIND,
			uintptr(unsafe.Pointer(&mask[0])), uintptr(len(mask)*64), 0)
		if e != 0 {
			return e
		}
		return nil
	})
	runtime.KeepAlive(&mask)
	if err != nil {
		return fmt.Errorf("mbind %#x+%d to node %d: %w", uintptr(addr), length, node, err)
	}
	return nil
}

// SetVMAAnonName names the anonymous VMA covering [addr, addr+length) with
// prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME). The kernel does not merge adjacent
// VMAs with different names. Kernels built without CONFIG_ANON_VMA_NAME return
// EINVAL.
func SetVMAAnonName(addr unsafe.Pointer, length uintptr, name string) error {
	cname, err := unix.BytePtrFromString(name)
	if err != nil {
		return fmt.Errorf("prctl(PR_SET_VMA_ANON_NAME) %q: %w", name, err)
	}
	err = ignoringEINTR(func() error {
		return unix.Prctl(unix.PR_SET_VMA, unix.PR_SET_VMA_ANON_NAME, uintptr(addr), length,
			uintptr(unsafe.Pointer(cname)))
	})
	runtime.KeepAlive(cname)
	if err != nil {
		return fmt.Errorf("prctl(PR_SET_VMA_ANON_NAME) %#x+%d: %w", uintptr(addr), length, err)
	}
	return nil
}

// ResidentPages reports how many of the pageSize pages in [addr, addr+length)
// are resident (mincore). addr must be page aligned.
func ResidentPages(addr unsafe.Pointer, length uintptr, pageSize uintptr) (int, error) {
	n := (length + pageSize - 1) / pageSize
	vec := make([]byte, n)
	err := ignoringEINTR(func() error {
		_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(addr), length, uintptr(unsafe.Pointer(&vec[0])))
		if e != 0 {
			return e
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("mincore %#x+%d: %w", uintptr(addr), length, err)
	}
	resident := 0
	for _, v := range vec {
		if v&1 != 0 {
			resident++
		}
	}
	return resident, nil
}

// PinThreadToCPU restricts the calling OS thread to one CPU. The caller MUST
// have called runtime.LockOSThread and stay locked for the goroutine's life.
func PinThreadToCPU(cpu int) error {
	var set unix.CPUSet
	if cpu < 0 || cpu >= len(set)*64 {
		return fmt.Errorf("sched_setaffinity: CPU %d out of range [0, %d)", cpu, len(set)*64)
	}
	set.Set(cpu)
	if err := ignoringEINTR(func() error { return unix.SchedSetaffinity(0, &set) }); err != nil {
		return fmt.Errorf("sched_setaffinity to CPU %d: %w", cpu, err)
	}
	return nil
}

// AllowedCPUs lists the CPUs the process may run on (sched_getaffinity).
func AllowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// Mlock page-locks b, faulting in its pages.
func Mlock(b []byte) error {
	if err := ignoringEINTR(func() error { return unix.Mlock(b) }); err != nil {
		return fmt.Errorf("mlock %#x+%d: %w", uintptr(unsafe.Pointer(unsafe.SliceData(b))), len(b), err)
	}
	return nil
}

// Munlock undoes Mlock.
func Munlock(b []byte) error {
	if err := ignoringEINTR(func() error { return unix.Munlock(b) }); err != nil {
		return fmt.Errorf("munlock %#x+%d: %w", uintptr(unsafe.Pointer(unsafe.SliceData(b))), len(b), err)
	}
	return nil
}

// MemlockLimit returns RLIMIT_MEMLOCK's soft limit in bytes; unlimited is
// reported as ^uint64(0).
func MemlockLimit() (uint64, error) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return 0, fmt.Errorf("getrlimit(RLIMIT_MEMLOCK): %w", err)
	}
	if r.Cur == unix.RLIM_INFINITY {
		return ^uint64(0), nil
	}
	return r.Cur, nil
}

// PhysicalMemoryBytes is the machine's total RAM (sysinfo).
func PhysicalMemoryBytes() (uint64, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, fmt.Errorf("sysinfo: %w", err)
	}
	return uint64(si.Totalram) * uint64(si.Unit), nil
}

// Errno constants the caller classifies errors with.
var (
	EINVAL = unix.EINVAL
	ENOMEM = unix.ENOMEM
	EPERM  = unix.EPERM
	EAGAIN = unix.EAGAIN
)

// Flags and advice values, re-exported so the package above needs no unix import.
const (
	MADV_HUGEPAGE       = unix.MADV_HUGEPAGE
	MADV_POPULATE_WRITE = unix.MADV_POPULATE_WRITE
	MAP_HUGETLB         = unix.MAP_HUGETLB
	MAP_HUGE_2MB        = unix.MAP_HUGE_2MB
)
