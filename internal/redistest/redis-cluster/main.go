// Command redis-cluster starts a local Redis Cluster (six redis-server
// nodes, three masters and three replicas, on loopback ports) in a
// directory, writes the nodes' addresses, comma separated, to a file, and
// runs until SIGINT or SIGTERM, when it stops the nodes. .ci/run uses it to
// give the tests one cluster (KVTIER_REDIS_CLUSTER); run it by hand for
// the same locally:
//
//	go run ./internal/redistest/redis-cluster -dir /tmp/kvtier-redis -addrs-file /tmp/kvtier-redis/addrs &
//	export KVTIER_REDIS_CLUSTER=$(cat /tmp/kvtier-redis/addrs)
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"kvtier.dev/internal/redistest"
)

func main() {
	dir := flag.String("dir", "", "directory for the nodes' configs and logs (created if missing)")
	addrsFile := flag.String("addrs-file", "", "file to write the nodes' addresses to, comma separated, once the cluster is up")
	pidsFile := flag.String("pids-file", "", "file to write the nodes' process ids to, one a line (optional)")
	flag.Parse()
	if err := run(*dir, *addrsFile, *pidsFile); err != nil {
		fmt.Fprintln(os.Stderr, "redis-cluster:", err)
		os.Exit(1)
	}
}

func run(dir, addrsFile, pidsFile string) error {
	if dir == "" || addrsFile == "" {
		return fmt.Errorf("-dir and -addrs-file are required")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	c, err := redistest.Start(dir, redistest.Options{})
	if err != nil {
		return err
	}
	defer c.Stop()
	if pidsFile != "" {
		var b strings.Builder
		for _, p := range c.Pids() {
			b.WriteString(strconv.Itoa(p) + "\n")
		}
		if err := writeFile(pidsFile, b.String()); err != nil {
			return err
		}
	}
	if err := writeFile(addrsFile, strings.Join(c.Addrs(), ",")+"\n"); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "redis-cluster: %s up in %s\n", strings.Join(c.Addrs(), ","), dir)
	<-sig
	return nil
}

// writeFile writes atomically, so that a reader polling for the file never
// sees half of it.
func writeFile(path, s string) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
