package cudastream

import "fmt"

// cuMaxRegisterBytes is the driver's limit on one cuMemHostRegister call:
// r580 refuses 512 GiB and more (design.md).
const cuMaxRegisterBytes = 512 << 30

// drvCheckRegisterLen refuses, before any driver call, what cuMemHostRegister
// would refuse or fail on in ways that are hard to read.
func drvCheckRegisterLen(n int) error {
	if n == 0 {
		return fmt.Errorf("cudastream: HostRegister: %w: empty range", ErrInvalidValue)
	}
	if int64(n) >= cuMaxRegisterBytes {
		return fmt.Errorf("cudastream: HostRegister: %w: %d bytes (%.1f GiB) in one call; the driver refuses 512 GiB or more, register in chunks of about 1 GiB",
			ErrInvalidValue, n, float64(n)/(1<<30))
	}
	return nil
}
