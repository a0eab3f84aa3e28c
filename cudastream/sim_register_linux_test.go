package cudastream

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestSimRegisterRefuses512GiB reserves 512 GiB of address space (PROT_NONE,
// MAP_NORESERVE: nothing is backed or touched) and checks that the sim
// refuses to register it in one call, as driver r580 does, and accepts a
// chunk of it.
func TestSimRegisterRefuses512GiB(t *testing.T) {
	const size = simMaxRegister
	b, err := unix.Mmap(-1, 0, size, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		t.Skipf("cannot reserve 512 GiB of address space: %v", err)
	}
	defer unix.Munmap(b)
	s := newTestSim(t, SimVirtualClock, LinkModel{})
	wantSimError(t, s.HostRegister(b), "cuMemHostRegister", ErrInvalidValue)
	must(t, s.HostRegister(b[:size-1]))
	must(t, s.HostUnregister(b[:size-1]))
}
