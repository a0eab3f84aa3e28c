//go:build !invariants

package nvme

const invariantsEnabled = false
