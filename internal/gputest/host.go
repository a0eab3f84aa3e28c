package gputest

import (
	"testing"

	"golang.org/x/sys/unix"

	"kvtier.dev/cudastream"
)

// HostAlloc returns n bytes of host memory that dev allocates pinned
// (Device.HostAlloc, cuMemHostAlloc on a GPU), freed when t ends.
func HostAlloc(t testing.TB, dev cudastream.Device, n int64) []byte {
	t.Helper()
	b, err := dev.HostAlloc(n)
	if err != nil {
		t.Fatalf("gputest: HostAlloc(%d): %v", n, err)
	}
	t.Cleanup(func() {
		if err := dev.HostFree(b); err != nil {
			t.Errorf("gputest: HostFree: %v", err)
		}
	})
	return b
}

// HostRegistered returns n bytes of page-aligned anonymous memory that dev
// pins (Device.HostRegister), as kvtier/pinned hands out, unregistered and
// unmapped when t ends.
func HostRegistered(t testing.TB, dev cudastream.Device, n int64) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("gputest: mmap of %d bytes: %v", n, err)
	}
	if err := dev.HostRegister(b); err != nil {
		unix.Munmap(b)
		t.Fatalf("gputest: HostRegister: %v", err)
	}
	t.Cleanup(func() {
		if err := dev.HostUnregister(b); err != nil {
			t.Errorf("gputest: HostUnregister: %v", err)
		}
		if err := unix.Munmap(b); err != nil {
			t.Errorf("gputest: munmap: %v", err)
		}
	})
	return b
}
