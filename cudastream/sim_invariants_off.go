//go:build !invariants

package cudastream

// simInvariants turns on the sim's expensive self-checks (a scan of every
// queue after each advance).
const simInvariants = false
