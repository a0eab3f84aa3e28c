//go:build !invariants

package trace

const invariantsEnabled = false
