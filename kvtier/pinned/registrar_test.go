package pinned

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"kvtier.dev/kvtier/pinned/internal/sys"
)

func TestMemlockVerdict(t *testing.T) {
	const limit = 8 << 20
	cases := []struct {
		asked, locked int64
		limit         uint64
		cap           bool
		ok            bool
	}{
		{4 * MiB, 4 * MiB, limit, false, true},
		{4 * MiB, 4*MiB + 4096, limit, false, false},
		{64 * MiB, 0, limit, true, true},
		{64 * MiB, 0, ^uint64(0), false, true},
		{1, 0, 0, false, false},
	}
	for _, c := range cases {
		err := memlockVerdict(c.asked, c.locked, c.limit, c.cap)
		if (err == nil) != c.ok {
			t.Errorf("%+v: %v", c, err)
		}
		if err != nil && (!errors.Is(err, ErrMemlockLimit) || !strings.Contains(err.Error(), "RLIMIT_MEMLOCK") ||
			!strings.Contains(err.Error(), "locking 4194304 bytes") && c.asked == 4*MiB) {
			t.Errorf("%+v: error %q does not name the limit and the size", c, err)
		}
	}
}

func TestParseStatusForMemlock(t *testing.T) {
	capOn, locked := parseStatusForMemlock("Name:\tx\nVmLck:\t    2048 kB\nCapEff:\t000001fffeffffff\n")
	if !capOn || locked != 2*MiB {
		t.Errorf("got %v %d", capOn, locked)
	}
	capOn, locked = parseStatusForMemlock("VmLck:\t0 kB\nCapEff:\t0000000000000000\n")
	if capOn || locked != 0 {
		t.Errorf("got %v %d", capOn, locked)
	}
}

// TestMlockRegistrarRespectsRlimit drops CAP_IPC_LOCK on one locked OS
// thread (capabilities are per thread; the thread exits with the goroutine
// and never returns to the runtime's pool), lowers RLIMIT_MEMLOCK, and asks
// the registrar for more than the limit.
func TestMlockRegistrarRespectsRlimit(t *testing.T) {
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old); err != nil {
		t.Fatal(err)
	}
	const limit = 8 << 20
	if old.Max != unix.RLIM_INFINITY && old.Max < limit {
		t.Skipf("hard RLIMIT_MEMLOCK %d is below %d", old.Max, limit)
	}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: limit, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_MEMLOCK, &old)

	const size = 16 << 20
	p, err := sys.MmapAnon(size, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Munmap(p, size)
	b := unsafe.Slice((*byte)(p), size)

	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: this thread loses a capability
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		data[0].Effective &^= 1 << capIPCLockBit
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- errSkip{err}
			return
		}
		errc <- MlockRegistrar{}.HostRegister(b)
	}()
	err = <-errc
	var skip errSkip
	if errors.As(err, &skip) {
		t.Skipf("cannot drop CAP_IPC_LOCK: %v", skip.error)
	}
	if !errors.Is(err, ErrMemlockLimit) || !strings.Contains(err.Error(), "16777216") || !strings.Contains(err.Error(), "8388608") {
		t.Fatalf("mlock of 16 MiB under an 8 MiB limit without CAP_IPC_LOCK: %v", err)
	}
	if got := vmLckBytes(t); got != 0 {
		t.Logf("VmLck %d after a refused mlock", got)
	}
}

type errSkip struct{ error }

func TestMlockRegistrarEmpty(t *testing.T) {
	if err := (MlockRegistrar{}).HostRegister(nil); err == nil {
		t.Error("mlock of nothing succeeded")
	}
}
