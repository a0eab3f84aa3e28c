package main

import (
	"fmt"
	"os"
	"syscall"
	"time"
)

// usage is the CPU time (user and system) and the peak resident set of a
// process that has exited.
func usage(ps *os.ProcessState) (time.Duration, int64, error) {
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return 0, 0, fmt.Errorf("no rusage for process %d", ps.Pid())
	}
	return ps.UserTime() + ps.SystemTime(), ru.Maxrss << 10, nil // ru_maxrss is in KiB on Linux
}
