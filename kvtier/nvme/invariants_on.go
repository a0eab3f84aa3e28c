//go:build invariants

package nvme

const invariantsEnabled = true
