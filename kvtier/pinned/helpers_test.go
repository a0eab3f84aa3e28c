package pinned

import (
	"bufio"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

// vmLckBytes reads the process's locked memory from /proc/self/status.
func vmLckBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	_, locked := parseStatusForMemlock(string(b))
	return locked
}

// mappedIn returns the /proc/self/maps lines that overlap [lo, hi).
func mappedIn(t *testing.T, lo, hi uint64) []string {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		a, b, ok := parseMapsRange(sc.Text())
		if ok && a < hi && b > lo {
			out = append(out, sc.Text())
		}
	}
	return out
}

// mapsMentioning returns the /proc/self/maps lines that contain s.
func mapsMentioning(t *testing.T, s string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

type call struct {
	register bool
	addr     uint64
	n        int64
}

// fakeRegistrar records every call, page-locks for real through
// MlockRegistrar (so VmLck shows leaks), and can fail at chunk failAt, run a
// hook before registering chunk i, or wait for a token per call on gate.
type fakeRegistrar struct {
	mu      sync.Mutex
	calls   []call
	regs    int
	failAt  int // -1: never
	failErr error
	before  func(i int)
	gate    chan struct{}
	inner   Registrar
}

var errInjected = errors.New("injected registration failure")

func newFake() *fakeRegistrar {
	return &fakeRegistrar{failAt: -1, failErr: errInjected, inner: MlockRegistrar{}}
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

func (f *fakeRegistrar) HostRegister(b []byte) error {
	f.mu.Lock()
	i := f.regs
	f.regs++
	before, gate := f.before, f.gate
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if before != nil {
		before(i)
	}
	if i == f.failAt {
		return f.failErr
	}
	if err := f.inner.HostRegister(b); err != nil {
		return err
	}
	f.mu.Lock()
	f.calls = append(f.calls, call{register: true, addr: addrOf(b), n: int64(len(b))})
	f.mu.Unlock()
	return nil
}

func (f *fakeRegistrar) HostUnregister(b []byte) error {
	f.mu.Lock()
	f.calls = append(f.calls, call{register: false, addr: addrOf(b), n: int64(len(b))})
	f.mu.Unlock()
	return f.inner.HostUnregister(b)
}

func (f *fakeRegistrar) snapshot() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

// checkCleanedUp asserts that nothing of [lo, hi) is mapped and that VmLck
// is back to before.
func checkCleanedUp(t *testing.T, lo uint64, size int64, lockedBefore int64) {
	hi := lo + uint64(size)
	t.Helper()
	if m := mappedIn(t, lo, hi); len(m) > 0 {
		t.Errorf("region [%#x, %#x) still mapped: %v", lo, hi, m)
	}
	if m := mapsMentioning(t, "kvtier-pinned-"); len(m) > 0 {
		t.Errorf("named chunk VMAs left: %v", m)
	}
	if got := vmLckBytes(t); got != lockedBefore {
		t.Errorf("VmLck = %d bytes, was %d before", got, lockedBefore)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
