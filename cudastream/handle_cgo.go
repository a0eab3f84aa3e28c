//go:build cgo

package cudastream

import "fmt"

// EventHandle returns the driver's handle (a CUevent) of e, an event of a
// device from Open, for code that calls the driver itself: a model's own
// runtime making its compute stream wait on kvtier's copies
// (cuStreamWaitEvent). The handle is valid until e is destroyed; the
// caller MUST NOT record, destroy or otherwise change the event through it.
// A simulated event has no handle (ErrNotSupported); a destroyed one is
// ErrInvalidValue.
func EventHandle(e Event) (uintptr, error) {
	ce, ok := e.(*cuEvent)
	if !ok {
		return 0, fmt.Errorf("cudastream: EventHandle: %w: the event (%T) is not a driver event", ErrNotSupported, e)
	}
	if ce.destroyed.Load() {
		return 0, ce.gone("EventHandle")
	}
	return uintptr(ce.e), nil
}
