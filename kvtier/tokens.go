package kvtier

import "unsafe"

// tokensEqual is slices.Equal for token blocks, as one memory compare
// (vector loads) instead of a loop over the tokens.
func tokensEqual(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true
	}
	sa := unsafe.String((*byte)(unsafe.Pointer(unsafe.SliceData(a))), 4*len(a))
	sb := unsafe.String((*byte)(unsafe.Pointer(unsafe.SliceData(b))), 4*len(b))
	return sa == sb
}
