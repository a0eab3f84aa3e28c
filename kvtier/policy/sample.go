package policy

import "kvtier.dev/internal/invariants"

// checkEvery samples the expensive invariant checks, which walk the whole
// structure: a structure with at most smallLen keys is checked after every
// change, one of n keys after every max(checkEvery, n)-th change, so that
// the checks cost O(1) per change on average and tests on traces stay fast
// with -tags invariants.
const (
	checkEvery = 1024
	smallLen   = 64
)

// sampler decides when an invariant check is due: it counts changes down
// to the next check.
type sampler struct{ left int }

func (s *sampler) due(n int) bool {
	if !invariants.Enabled {
		return false
	}
	if n <= smallLen {
		return true
	}
	if s.left--; s.left > 0 {
		return false
	}
	s.left = max(checkEvery, n)
	return true
}
