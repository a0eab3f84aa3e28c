//go:build !cgo

package cudastream

import "fmt"

// Open reports ErrNoDriver: without cgo, libcuda.so.1 cannot be loaded. Use
// NewSim for a device that works everywhere.
func Open(ordinal int) (Device, error) {
	return nil, fmt.Errorf("%w: built without cgo (CGO_ENABLED=0), so libcuda.so.1 cannot be loaded (Open(%d))", ErrNoDriver, ordinal)
}
