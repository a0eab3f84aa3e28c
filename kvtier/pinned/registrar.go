package pinned

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"kvtier.dev/kvtier/pinned/internal/sys"
)

// Registrar page-locks host memory and maps it for DMA. cudastream.Device
// satisfies it (cuMemHostRegister / cuMemHostUnregister).
//
// Alloc calls HostRegister from one goroutine, once per chunk, in address
// order, each call under 512 GiB; HostUnregister gets exactly the ranges
// that HostRegister accepted.
type Registrar interface {
	HostRegister(b []byte) error
	HostUnregister(b []byte) error
}

// MlockRegistrar registers with mlock(2): the memory is page-locked (never
// swapped or migrated) but not mapped for any device. It makes the allocator
// useful and testable without a GPU. It respects RLIMIT_MEMLOCK: a chunk that
// would take the process past the limit is refused with ErrMemlockLimit,
// naming the limit and the size asked, unless the thread has CAP_IPC_LOCK.
//
// mlock changes VMA flags and so takes the mmap lock for writing, which
// stalls the touchers' page faults while it runs; cuMemHostRegister only
// reads it. Pipeline figures measured with MlockRegistrar therefore say
// little about the figures with a GPU.
type MlockRegistrar struct{}

func (MlockRegistrar) HostRegister(b []byte) error {
	if len(b) == 0 {
		return errors.New("pinned: mlock of an empty range")
	}
	if err := checkMemlock(int64(len(b))); err != nil {
		return err
	}
	if err := sys.Mlock(b); err != nil {
		if errors.Is(err, sys.ENOMEM) || errors.Is(err, sys.EPERM) || errors.Is(err, sys.EAGAIN) {
			limit, _ := sys.MemlockLimit()
			return fmt.Errorf("%w: mlock of %d bytes refused with RLIMIT_MEMLOCK (ulimit -l) at %s: %w",
				ErrMemlockLimit, len(b), limitString(limit), err)
		}
		return err
	}
	return nil
}

func (MlockRegistrar) HostUnregister(b []byte) error {
	return sys.Munlock(b)
}

// checkMemlock refuses, before calling mlock, a request that the kernel
// would refuse for RLIMIT_MEMLOCK, so the error can say what to change.
func checkMemlock(askedBytes int64) error {
	limit, err := sys.MemlockLimit()
	if err != nil {
		return err
	}
	if limit == ^uint64(0) {
		return nil
	}
	st, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		return nil // cannot tell: let mlock decide
	}
	capIPCLock, lockedBytes := parseStatusForMemlock(string(st))
	return memlockVerdict(askedBytes, lockedBytes, limit, capIPCLock)
}

// capIPCLockBit is CAP_IPC_LOCK's bit in the capability masks.
const capIPCLockBit = 14

// parseStatusForMemlock reads CapEff's CAP_IPC_LOCK bit and VmLck (bytes)
// from a /proc/*/status text.
func parseStatusForMemlock(status string) (capIPCLock bool, lockedBytes int64) {
	for _, line := range strings.Split(status, "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		rest = strings.TrimSpace(rest)
		switch name {
		case "CapEff":
			if v, err := strconv.ParseUint(rest, 16, 64); err == nil {
				capIPCLock = v&(1<<capIPCLockBit) != 0
			}
		case "VmLck":
			if f := strings.Fields(rest); len(f) > 0 {
				if v, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					lockedBytes = v * KiB
				}
			}
		}
	}
	return capIPCLock, lockedBytes
}

// memlockVerdict decides whether locking askedBytes more is within limit.
func memlockVerdict(askedBytes, lockedBytes int64, limit uint64, capIPCLock bool) error {
	if capIPCLock || limit == ^uint64(0) || uint64(askedBytes+lockedBytes) <= limit {
		return nil
	}
	return fmt.Errorf("%w: locking %d bytes with %d already locked exceeds RLIMIT_MEMLOCK (ulimit -l) of %s; raise it (ulimit -l unlimited) or grant CAP_IPC_LOCK",
		ErrMemlockLimit, askedBytes, lockedBytes, limitString(limit))
}

func limitString(limit uint64) string {
	if limit == ^uint64(0) {
		return "unlimited"
	}
	return fmt.Sprintf("%d bytes", limit)
}
