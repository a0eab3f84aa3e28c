package cudastream

import "fmt"

// Error is a failed driver call (or a failure the simulator reports the same
// way). It keeps the call's name, the CUresult and the driver's own text.
type Error struct {
	Call string // e.g. "cuMemcpyHtoDAsync"
	Code int    // the CUresult
	Name string // e.g. "CUDA_ERROR_INVALID_VALUE"
	Text string // the driver's description
}

func (e *Error) Error() string {
	if e.Text == "" {
		return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Code)
	}
	return fmt.Sprintf("%s: %s (%d): %s", e.Call, e.Name, e.Code, e.Text)
}

// CUresult codes that map to sentinels.
const (
	cudaSuccess                = 0
	cudaErrorInvalidValue      = 1
	cudaErrorOutOfMemory       = 2
	cudaErrorNotInitialized    = 3
	cudaErrorNoDevice          = 100
	cudaErrorInvalidDevice     = 101
	cudaErrorNotFound          = 500
	cudaErrorNotReady          = 600
	cudaErrorIllegalAddress    = 700
	cudaErrorLaunchFailed      = 719
	cudaErrorAlreadyRegistered = 712
	cudaErrorNotRegistered     = 713
	cudaErrorNotSupported      = 801
)

// Is makes errors.Is(err, ErrInvalidValue) and the like work on driver errors.
func (e *Error) Is(target error) bool {
	switch e.Code {
	case cudaErrorInvalidValue:
		return target == ErrInvalidValue
	case cudaErrorOutOfMemory:
		return target == ErrOutOfMemory
	case cudaErrorNoDevice, cudaErrorInvalidDevice, cudaErrorNotInitialized:
		return target == ErrNoDriver
	case cudaErrorNotReady:
		return target == ErrNotReady
	case cudaErrorIllegalAddress:
		return target == ErrIllegalAddress
	case cudaErrorAlreadyRegistered:
		return target == ErrAlreadyRegistered
	case cudaErrorNotRegistered:
		return target == ErrNotRegistered
	case cudaErrorNotSupported, cudaErrorNotFound:
		return target == ErrNotSupported
	}
	return false
}

// simError builds the *Error the simulator returns for a check a real driver
// would also fail, so that callers see one error shape on both devices.
func simError(call string, code int, format string, args ...any) error {
	return &Error{Call: call, Code: code, Name: resultName(code), Text: fmt.Sprintf(format, args...)}
}

// resultName names the CUresult codes this package knows by name; the real
// driver's cuGetErrorName is preferred where it is loaded.
func resultName(code int) string {
	switch code {
	case cudaSuccess:
		return "CUDA_SUCCESS"
	case cudaErrorInvalidValue:
		return "CUDA_ERROR_INVALID_VALUE"
	case cudaErrorOutOfMemory:
		return "CUDA_ERROR_OUT_OF_MEMORY"
	case cudaErrorNotInitialized:
		return "CUDA_ERROR_NOT_INITIALIZED"
	case cudaErrorNoDevice:
		return "CUDA_ERROR_NO_DEVICE"
	case cudaErrorInvalidDevice:
		return "CUDA_ERROR_INVALID_DEVICE"
	case cudaErrorNotFound:
		return "CUDA_ERROR_NOT_FOUND"
	case cudaErrorNotReady:
		return "CUDA_ERROR_NOT_READY"
	case cudaErrorIllegalAddress:
		return "CUDA_ERROR_ILLEGAL_ADDRESS"
	case cudaErrorLaunchFailed:
		return "CUDA_ERROR_LAUNCH_FAILED"
	case cudaErrorAlreadyRegistered:
		return "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"
	case cudaErrorNotRegistered:
		return "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"
	case cudaErrorNotSupported:
		return "CUDA_ERROR_NOT_SUPPORTED"
	}
	return fmt.Sprintf("CUresult(%d)", code)
}
