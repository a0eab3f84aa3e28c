//go:build cgo

package cudastream

// SetBatchChunk is setBatchChunk, and CopyPTX points at copyPTX, the copy
// kernel's source that Open loads, for TestCuCopyVariants.
var (
	SetBatchChunk = setBatchChunk
	CopyPTX       = &copyPTX
)
