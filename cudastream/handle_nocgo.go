//go:build !cgo

package cudastream

import "fmt"

// EventHandle reports ErrNotSupported: without cgo no event is a driver
// event (see the cgo build's EventHandle).
func EventHandle(e Event) (uintptr, error) {
	return 0, fmt.Errorf("cudastream: EventHandle: %w: built without cgo, the event (%T) is not a driver event", ErrNotSupported, e)
}
