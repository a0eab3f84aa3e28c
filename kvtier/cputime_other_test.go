//go:build !linux

package kvtier

import "time"

// threadCPU is not available here.
func threadCPU() (time.Duration, bool) { return 0, false }

// processCPU is not available here.
func processCPU() (time.Duration, bool) { return 0, false }
