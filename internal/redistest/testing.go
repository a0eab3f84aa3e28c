package redistest

import (
	"errors"
	"os"
	"sync"
	"testing"
)

var shared struct {
	once  sync.Once
	c     *Cluster
	dir   string
	addrs []string
	err   error
}

// unavailable skips t, or fails it when CI=true: CI installs redis-server
// and must run every test that needs it.
func unavailable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true but no Redis Cluster: %v (set %s or install redis-server)", err, Env)
	}
	t.Skipf("no Redis Cluster: %v (set %s or install redis-server)", err, Env)
}

// Shared returns the addresses of a cluster that t may read and write but
// MUST NOT break (no kills, no config changes): the one named by
// KVTIER_REDIS_CLUSTER, or one started once for this test binary (stopped
// by RunMain). Use distinct key prefixes per test.
func Shared(t testing.TB) []string {
	t.Helper()
	if a := envAddrs(); a != nil {
		return a
	}
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "kvtier-redis-")
		if shared.err != nil {
			return
		}
		shared.c, shared.err = Start(shared.dir, Options{})
		if shared.err == nil {
			shared.addrs = shared.c.Addrs()
		}
	})
	if shared.err != nil {
		if errors.Is(shared.err, ErrNoServer) {
			unavailable(t, shared.err)
		}
		t.Fatal(shared.err)
	}
	return shared.addrs
}

// Private starts a cluster for t alone (t may kill and stop its nodes),
// stopped when t ends.
func Private(t testing.TB, o Options) *Cluster {
	t.Helper()
	c, err := Start(t.TempDir(), o)
	if errors.Is(err, ErrNoServer) {
		unavailable(t, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// RunMain runs the package's tests and then stops the cluster Shared
// started, if any: call it from TestMain as os.Exit(redistest.RunMain(m)).
func RunMain(m *testing.M) int {
	code := m.Run()
	if shared.c != nil {
		shared.c.Stop()
		os.RemoveAll(shared.dir)
	}
	return code
}
