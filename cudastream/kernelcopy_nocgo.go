//go:build !cgo

package cudastream

// setBatchTuning has nothing to tune without cgo: Open never returns a real
// device, so the measurements that call it skip.
func setBatchTuning(dev Device, order int, flags uint, hints, check bool) {}
