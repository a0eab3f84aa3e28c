//go:build !linux

package main

import (
	"errors"
	"os"
	"time"
)

// usage reads a process's peak resident set from Linux's rusage only.
func usage(*os.ProcessState) (time.Duration, int64, error) {
	return 0, 0, errors.New("replayscale measures the peak RSS on Linux only")
}
