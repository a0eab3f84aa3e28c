//go:build invariants

package kvtier

// invariantsEnabled turns on the expensive consistency checks of check.go.
const invariantsEnabled = true
