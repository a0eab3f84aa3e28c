package nvme

import "fmt"

// broken panics for a broken internal invariant: the only panic in the
// package. Call sites test the condition first, so that the arguments are
// not boxed on the fast path.
func broken(format string, args ...any) {
	panic(fmt.Sprintf("nvme: invariant broken: "+format, args...))
}
