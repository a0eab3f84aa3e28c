package cost

import (
	"errors"
	"fmt"
)

// ErrUnknownName is wrapped by preset lookups; the error lists the names.
var ErrUnknownName = errors.New("unknown name")

// ErrDoesNotFit is wrapped by Scenario.CheckFits.
var ErrDoesNotFit = errors.New("does not fit in GPU memory")

// FieldError is a rejected value under the user's name for it (JSON key).
type FieldError struct {
	Field  string
	Value  any
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s = %v: %s", e.Field, e.Value, e.Reason)
}

func fieldErr(field string, value any, format string, args ...any) error {
	return &FieldError{Field: field, Value: value, Reason: fmt.Sprintf(format, args...)}
}

// Bounds that separate a plausible figure from a typo. They are generous on
// purpose: they catch a missing unit prefix, not an unusual machine.
const (
	maxLayers          = 1000
	maxHeads           = 4096
	maxHeadDim         = 16384
	maxParams          = 1e14 // 100 trillion
	maxTokens          = 1 << 30
	maxBandwidthBytesS = 1e13 // 10 TB/s
	maxFLOPS           = 1e17 // 100 PFLOP/s per GPU
	maxHBMBytesS       = 1e14 // 100 TB/s
	maxMemoryBytes     = 1e13 // 10 TB per GPU
	maxTP              = 1024
	maxLatencySeconds  = 10
)

// checkTokens rejects a token count outside [min, maxTokens].
func checkTokens(field string, n, min int) error {
	if n < min || n > maxTokens {
		return fieldErr(field, n, "must be between %d and %d tokens", min, maxTokens)
	}
	return nil
}

func checkTP(tp int) error {
	if tp < 1 || tp > maxTP {
		return fieldErr("tp", tp, "tensor-parallel degree must be between 1 and %d", maxTP)
	}
	return nil
}
