package policy

import "fmt"

// assertf panics when a broken invariant is found. It is the package's only
// panic: bad arguments are returned as errors by the constructors, and the
// methods of the Policy interface accept any input.
func assertf(ok bool, format string, args ...any) {
	if !ok {
		panic(fmt.Sprintf(format, args...))
	}
}

// checkEvery samples the expensive invariant checks, which walk the whole
// structure: a structure with at most smallLen keys is checked after every
// change, one of n keys after every max(checkEvery, n)-th change, so that
// the checks cost O(1) per change on average and tests on traces stay fast
// with -tags invariants.
const (
	checkEvery = 1024
	smallLen   = 64
)

// sampler decides when an invariant check is due.
type sampler uint32

func (s *sampler) due(n int) bool {
	if !invariantsEnabled {
		return false
	}
	*s++
	return n <= smallLen || uint32(*s)%uint32(max(checkEvery, n)) == 0
}
