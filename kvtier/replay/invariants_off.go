//go:build !invariants

package replay

const invariantsEnabled = false
