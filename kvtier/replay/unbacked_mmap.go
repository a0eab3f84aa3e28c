//go:build linux || darwin

package replay

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// unbacked returns n bytes of address space with no memory behind it
// (PROT_NONE, MAP_NORESERVE): a host pool the simulated device registers
// and times copies from but, TimingOnly, never reads or writes. Touching
// it faults. Free it with freeUnbacked.
func unbacked(n int64) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("replay: reserve %d bytes of address space for the simulated host pool: %w", n, err)
	}
	return b, nil
}

func freeUnbacked(b []byte) error { return unix.Munmap(b) }
