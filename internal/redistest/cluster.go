// Package redistest starts Redis Clusters of local redis-server processes
// for tests and benchmarks: six nodes (three masters, three replicas) on
// loopback ports, in a directory of their own, and helpers to kill, stop
// and resume nodes for fault tests.
//
// Tests get a cluster with Shared (the one .ci/run started, named by
// KVTIER_REDIS_CLUSTER, or one started for the test binary) or Private
// (their own, for tests that kill nodes). Without redis-server they skip,
// or fail when CI=true.
package redistest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Options shape a cluster. Zero values mean the defaults.
type Options struct {
	// Masters and ReplicasPerMaster: 3 and 1.
	Masters, ReplicasPerMaster int
	// NodeTimeout is cluster-node-timeout: how long a silent master is
	// waited for before its replica takes over. 0 means 5 s, long enough
	// that a loaded machine does not fail nodes over by itself; fault
	// tests that kill a master set 1 s.
	NodeTimeout time.Duration
	// MaxMemory, when set, caps each node's memory ("maxmemory"), with
	// MaxMemoryPolicy ("noeviction" if empty).
	MaxMemory       string
	MaxMemoryPolicy string
	// Password sets requirepass and masterauth on every node (the default
	// user's password).
	Password string
	// RedisServer is the server binary; empty means "redis-server" on PATH.
	RedisServer string
}

// Cluster is a running local cluster.
type Cluster struct {
	Dir   string
	Nodes []*Node
	opts  Options
}

// Node is one redis-server process.
type Node struct {
	Addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// ErrNoServer means redis-server is not installed.
var ErrNoServer = errors.New("redistest: redis-server not found on PATH")

// Start starts a cluster in dir and waits until it serves every slot and
// every replica is linked to its master.
func Start(dir string, o Options) (*Cluster, error) {
	if o.Masters == 0 {
		o.Masters = 3
	}
	if o.ReplicasPerMaster == 0 {
		o.ReplicasPerMaster = 1
	}
	if o.NodeTimeout == 0 {
		o.NodeTimeout = 5 * time.Second
	}
	if o.RedisServer == "" {
		o.RedisServer = "redis-server"
	}
	bin, err := exec.LookPath(o.RedisServer)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoServer, err)
	}
	n := o.Masters * (1 + o.ReplicasPerMaster)
	ports, err := freePorts(n)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, opts: o}
	for _, p := range ports {
		node, err := startNode(bin, dir, p, &o)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, node)
	}
	if err := c.form(); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func startNode(bin, dir string, port int, o *Options) (*Node, error) {
	p := strconv.Itoa(port)
	args := []string{"--port", p, "--bind", "127.0.0.1", "--protected-mode", "no",
		"--cluster-enabled", "yes", "--cluster-config-file", "nodes-" + p + ".conf",
		"--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10),
		"--dir", dir, "--dbfilename", "dump-" + p + ".rdb", "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
		"--logfile", filepath.Join(dir, "redis-"+p+".log")}
	if o.MaxMemory != "" {
		pol := o.MaxMemoryPolicy
		if pol == "" {
			pol = "noeviction"
		}
		args = append(args, "--maxmemory", o.MaxMemory, "--maxmemory-policy", pol)
	}
	if o.Password != "" {
		args = append(args, "--requirepass", o.Password, "--masterauth", o.Password)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("redistest: starting %s on port %s: %w", bin, p, err)
	}
	n := &Node{Addr: "127.0.0.1:" + p, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(n.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := Do(n.Addr, o.Password, "PING"); err == nil {
			return n, nil
		} else if time.Now().After(deadline) {
			n.Kill()
			return nil, fmt.Errorf("redistest: node %s did not answer PING in 10 s (log %s): %w", n.Addr, filepath.Join(dir, "redis-"+p+".log"), err)
		}
		select {
		case <-n.done:
			return nil, fmt.Errorf("redistest: node %s exited at start (log %s)", n.Addr, filepath.Join(dir, "redis-"+p+".log"))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// freePorts picks n ports whose cluster bus ports (+10000) are free too.
func freePorts(n int) ([]int, error) {
	for range 50 {
		base := 20000 + rand.IntN(2000)*10
		ok := true
		for i := range n {
			for _, p := range []int{base + i, base + i + 10000} {
				l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
				if err != nil {
					ok = false
					break
				}
				l.Close()
			}
			if !ok {
				break
			}
		}
		if ok {
			ports := make([]int, n)
			for i := range ports {
				ports[i] = base + i
			}
			return ports, nil
		}
	}
	return nil, fmt.Errorf("redistest: no %d free loopback ports (and bus ports) found in 50 tries", n)
}

// form joins the nodes: slots split evenly over the first Masters nodes,
// the others replicate them in turn.
func (c *Cluster) form() error {
	pw := c.opts.Password
	first := c.Nodes[0]
	host, port, _ := net.SplitHostPort(first.Addr)
	for _, n := range c.Nodes[1:] {
		if _, err := Do(n.Addr, pw, "CLUSTER", "MEET", host, port); err != nil {
			return err
		}
	}
	const slots = 16384
	m := c.opts.Masters
	for i := range m {
		lo, hi := i*slots/m, (i+1)*slots/m-1
		if _, err := Do(c.Nodes[i].Addr, pw, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)); err != nil {
			return err
		}
	}
	ids := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		id, err := Do(n.Addr, pw, "CLUSTER", "MYID")
		if err != nil {
			return err
		}
		ids[i] = id
	}
	// A node can replicate a master only once it knows it.
	if err := c.waitFor(10*time.Second, "every node knows every other", func(n *Node) (bool, error) {
		s, err := Do(n.Addr, pw, "CLUSTER", "NODES")
		return strings.Count(strings.TrimSpace(s), "\n")+1 == len(c.Nodes), err
	}); err != nil {
		return err
	}
	for i := m; i < len(c.Nodes); i++ {
		if _, err := Do(c.Nodes[i].Addr, pw, "CLUSTER", "REPLICATE", ids[(i-m)%m]); err != nil {
			return err
		}
	}
	return c.WaitHealthy(20 * time.Second)
}

// WaitHealthy waits until every live node says the cluster is ok and
// every live replica's link to its master is up.
func (c *Cluster) WaitHealthy(timeout time.Duration) error {
	pw := c.opts.Password
	return c.waitFor(timeout, "cluster_state:ok and replicas linked", func(n *Node) (bool, error) {
		info, err := Do(n.Addr, pw, "CLUSTER", "INFO")
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			return false, err
		}
		repl, err := Do(n.Addr, pw, "INFO", "replication")
		if err != nil {
			return false, err
		}
		return strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up"), nil
	})
}

func (c *Cluster) waitFor(timeout time.Duration, what string, ok func(*Node) (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		all, last := true, error(nil)
		for _, n := range c.Nodes {
			if !n.Alive() {
				continue
			}
			good, err := ok(n)
			if !good {
				all, last = false, err
				break
			}
		}
		if all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: cluster in %s: not %s after %v (last error: %v)", c.Dir, what, timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Addrs are the nodes' addresses.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		a[i] = n.Addr
	}
	return a
}

// MasterOf returns the live node that serves key's slot as master now.
func (c *Cluster) MasterOf(key string) (*Node, error) {
	pw := c.opts.Password
	var errs []error
	for _, n := range c.Nodes {
		if !n.Alive() {
			continue
		}
		slot, err := Do(n.Addr, pw, "CLUSTER", "KEYSLOT", key)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s, _ := strconv.Atoi(slot)
		nodes, err := Do(n.Addr, pw, "CLUSTER", "NODES")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
				continue
			}
			for _, r := range f[8:] {
				lo, hi, found := strings.Cut(r, "-")
				if !found {
					hi = lo
				}
				a, err1 := strconv.Atoi(lo)
				b, err2 := strconv.Atoi(hi)
				if err1 == nil && err2 == nil && a <= s && s <= b {
					addr, _, _ := strings.Cut(f[1], "@")
					for _, m := range c.Nodes {
						if m.Addr == addr {
							return m, nil
						}
					}
				}
			}
		}
		return nil, fmt.Errorf("redistest: no live master serves slot %d of %q", s, key)
	}
	return nil, fmt.Errorf("redistest: no node answered: %w", errors.Join(errs...))
}

// Alive reports whether the node's process is still running.
func (n *Node) Alive() bool {
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// Kill kills the node (SIGKILL) and waits for it to exit.
func (n *Node) Kill() {
	n.cmd.Process.Signal(syscall.SIGCONT)
	n.cmd.Process.Kill()
	<-n.done
}

// Pause stops the node with SIGSTOP: it keeps its connections open and
// answers nothing.
func (n *Node) Pause() error { return n.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a paused node (SIGCONT).
func (n *Node) Resume() error { return n.cmd.Process.Signal(syscall.SIGCONT) }

// Stop kills every node. It is safe to call twice.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		if n.Alive() {
			n.Kill()
		}
	}
}

// Env is the variable that names a running cluster's addresses, comma
// separated, for tests (.ci/run sets it).
const Env = "KVTIER_REDIS_CLUSTER"

// envAddrs returns the addresses in Env, if any.
func envAddrs() []string {
	v := strings.TrimSpace(os.Getenv(Env))
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// WaitReplicated waits until every live master's replicas have
// acknowledged all its writes so far, so that a failover loses none.
func (c *Cluster) WaitReplicated(timeout time.Duration) error {
	pw := c.opts.Password
	return c.waitFor(timeout, "replicas caught up", func(n *Node) (bool, error) {
		repl, err := Do(n.Addr, pw, "INFO", "replication")
		if err != nil || !strings.Contains(repl, "role:master") {
			return err == nil, err
		}
		var offset string
		var acked []string
		for _, line := range strings.Split(repl, "\n") {
			line = strings.TrimSpace(line)
			if v, ok := strings.CutPrefix(line, "master_repl_offset:"); ok {
				offset = v
			}
			if strings.HasPrefix(line, "slave") && strings.Contains(line, "offset=") {
				_, rest, _ := strings.Cut(line, "offset=")
				v, _, _ := strings.Cut(rest, ",")
				acked = append(acked, v)
			}
		}
		for _, a := range acked {
			if a != offset {
				return false, nil
			}
		}
		return true, nil
	})
}

// Pids are the nodes' process ids.
func (c *Cluster) Pids() []int {
	p := make([]int, len(c.Nodes))
	for i, n := range c.Nodes {
		p[i] = n.cmd.Process.Pid
	}
	return p
}
