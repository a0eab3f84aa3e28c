package devmover

import (
	"testing"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/policy"
)

func newLRU(t testing.TB, n int) policy.Policy[kvtier.BlockRef] {
	t.Helper()
	p, err := policy.NewDenseLRU[kvtier.BlockRef](n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustNew(t testing.TB, cfg kvtier.Config) *kvtier.Manager {
	t.Helper()
	m, err := kvtier.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// verify runs the manager's full consistency walk.
func verify(t testing.TB, m *kvtier.Manager) {
	t.Helper()
	if err := m.Verify(); err != nil {
		t.Fatal(err)
	}
}

// toks returns n blocks of bt tokens, numbered from base.
func toks(n, bt int, base int32) []int32 {
	out := make([]int32, n*bt)
	for i := range out {
		out[i] = base + int32(i)
	}
	return out
}
