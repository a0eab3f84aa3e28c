package redistest

import (
	"errors"
	"strings"
	"testing"
)

func TestStartWithoutServer(t *testing.T) {
	_, err := Start(t.TempDir(), Options{RedisServer: "kvtier-no-such-redis-server"})
	if !errors.Is(err, ErrNoServer) {
		t.Fatalf("%v, want ErrNoServer", err)
	}
}

// TestClusterWithPassword: a cluster with a password forms, Do
// authenticates, a wrong password fails, and a killed node is dead. (The
// fault tests of kvtier/remote pause and resume nodes.)
func TestClusterWithPassword(t *testing.T) {
	c, err := Start(t.TempDir(), Options{Masters: 3, Password: "pw"})
	if errors.Is(err, ErrNoServer) {
		unavailable(t, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if len(c.Nodes) != 6 || len(c.Pids()) != 6 {
		t.Fatalf("%d nodes, want 6", len(c.Nodes))
	}
	if s, err := Do(c.Nodes[0].Addr, "pw", "CLUSTER", "INFO"); err != nil || !strings.Contains(s, "cluster_state:ok") {
		t.Fatalf("CLUSTER INFO: %q, %v", s, err)
	}
	if _, err := Do(c.Nodes[0].Addr, "wrong", "PING"); err == nil {
		t.Error("a wrong password was accepted")
	}
	m, err := c.MasterOf("some-key")
	if err != nil {
		t.Fatal(err)
	}
	m.Kill()
	if m.Alive() {
		t.Error("a killed node is alive")
	}
	c.Stop() // and again by the defer: safe twice
}
