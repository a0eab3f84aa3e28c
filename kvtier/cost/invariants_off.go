//go:build !invariants

package cost

const invariantsEnabled = false
