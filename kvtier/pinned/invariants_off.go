//go:build !invariants

package pinned

const invariantsEnabled = false
