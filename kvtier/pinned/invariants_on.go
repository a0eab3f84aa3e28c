//go:build invariants

package pinned

// invariantsEnabled turns on the expensive checks: before each chunk is
// registered, mincore proves every page of it is resident.
const invariantsEnabled = true
