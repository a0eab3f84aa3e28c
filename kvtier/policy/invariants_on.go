//go:build invariants

package policy

// invariantsEnabled turns on the expensive structural checks (build tag
// invariants). CI runs the tests with it.
const invariantsEnabled = true
