//go:build unix

package main

import "golang.org/x/sys/unix"

// openFileLimit returns the process's open-file limit (RLIMIT_NOFILE's
// soft limit, which Go raised to the hard one at start).
func openFileLimit() (uint64, bool) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		return 0, false
	}
	return uint64(r.Cur), true
}
