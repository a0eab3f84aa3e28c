package cudastream

// The GPU tests are in package cudastream_test, outside this one, so that
// they can use internal/gputest, which imports this package. These are
// the unexported hooks they tune with.

// SetBatchTuning is setBatchTuning, for TestCuCopyMethodsPerf.
var SetBatchTuning = setBatchTuning
