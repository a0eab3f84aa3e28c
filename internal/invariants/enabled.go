//go:build invariants

package invariants

// Enabled turns on the expensive self-checks (build tag invariants).
const Enabled = true
