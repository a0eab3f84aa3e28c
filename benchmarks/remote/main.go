// Command remote measures kvtier's remote tier (kvtier/remote over Redis
// Cluster) against the raw client it is built on, side by side in one run,
// with the same connections (one rueidis client) and the same value size:
//
//   - raw SET: one SET of the whole block per op, from --depth goroutines;
//   - tier write: Cache.Put of each block and Flush, with --depth writers
//     (each block: an EXISTS, then its parts and its header in one
//     pipelined batch; checksums computed);
//   - raw GET: one GET of the whole block per op, from --depth goroutines
//     (the bytes are not copied or checked);
//   - tier read: Cache.Get of one block per call from --depth goroutines
//     (header and parts in one round trip, copied into the caller's
//     buffer, header and payload checksums verified);
//   - raw GET and tier read latency: one 4 KiB value or block at a time,
//     the time of one call: the round trip a fetch pays besides its bytes
//     (the replay's remote link latency).
//
// Rates are payload GiB/s per pass of --blocks blocks; each round runs
// every case once, raw first on even rounds and tier first on odd ones.
// Passes are short (16 blocks, 32 MiB) and rounds many (61) so that the
// load of a shared machine, which comes in bursts, falls on both sides of
// a pair alike; the ratio within each round is the figure to read. The
// tier's keys are new each round (a block it has stored already is not
// written again) and every written key is deleted after its pass, outside
// the timing. Without --addrs it starts a local six-node cluster (three
// masters, three replicas) in a temporary directory and stops it at exit.
//
//	go build -o /tmp/remote-bench ./benchmarks/remote && /tmp/remote-bench --machine local
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"kvtier.dev/internal/bytesize"
	"kvtier.dev/internal/redistest"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/remote"
)

// options are the command's flags.
type options struct {
	machine, addrs, block, part, commit, out string
	blocks, depth, rounds                    int
}

func main() {
	var o options
	flag.StringVar(&o.machine, "machine", "local", "machine name for the results files")
	flag.StringVar(&o.addrs, "addrs", "", "cluster nodes, comma separated; empty starts a local six-node cluster")
	flag.StringVar(&o.block, "block", "2MiB", "block (value) size")
	flag.IntVar(&o.blocks, "blocks", 16, "blocks per pass")
	flag.IntVar(&o.depth, "depth", 8, "operations in flight: goroutines for raw and tier reads and raw writes, the tier's writers")
	flag.StringVar(&o.part, "part", "1MiB", "the tier's PartBytes")
	flag.IntVar(&o.rounds, "rounds", 61, "timed rounds of every case")
	flag.StringVar(&o.out, "out", "benchmarks/results", "directory for remote-<machine>.json and .md")
	flag.StringVar(&o.commit, "commit", "", "the commit measured, for the results (empty: the one the binary records, if any)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "remote:", err)
		os.Exit(1)
	}
}

// run checks the flags, opens the cluster and the caches, times every
// case and writes the results.
func run(o options) error {
	size, err := bytesize.Parse(o.block)
	if err != nil {
		return fmt.Errorf("--block: %w", err)
	}
	part, err := bytesize.Parse(o.part)
	if err != nil {
		return fmt.Errorf("--part: %w", err)
	}
	if o.blocks <= 0 || o.depth <= 0 || o.rounds <= 0 {
		return fmt.Errorf("--blocks %d, --depth %d and --rounds %d must be positive", o.blocks, o.depth, o.rounds)
	}
	nodes, stop, err := clusterNodes(o.addrs)
	if err != nil {
		return err
	}
	defer stop()
	b, err := openBench(nodes, int(size), int(part), o.blocks, o.depth)
	if err != nil {
		return err
	}
	defer b.close()
	if err := b.writeSmall(); err != nil {
		return err
	}
	defer b.deleteSmall()
	loadStart := loadAvg()
	samples, err := b.timeRounds(o.rounds)
	if err != nil {
		return err
	}
	f := results.New("remote", o.machine, o.commit)
	addRows(f, samples)
	f.Notes = append(f.Notes, b.notes(o, len(nodes), loadStart)...)
	if err := f.Markdown(os.Stdout); err != nil {
		return err
	}
	return f.Write(o.out)
}

// clusterNodes are the cluster's nodes: addrList's, or, if it is empty,
// those of a local six-node cluster started in a temporary directory,
// which stop stops and removes.
func clusterNodes(addrList string) (nodes []string, stop func(), err error) {
	if addrList != "" {
		return strings.Split(addrList, ","), func() {}, nil
	}
	dir, err := os.MkdirTemp("", "kvtier-remote-bench-")
	if err != nil {
		return nil, nil, err
	}
	cl, err := redistest.Start(dir, redistest.Options{})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return cl.Addrs(), func() {
		cl.Stop()
		os.RemoveAll(dir)
	}, nil
}

// openBench opens one rueidis client on nodes and the two caches on it
// (size-byte blocks in part-byte parts, and smallBytes ones for the
// latency), and makes the payloads. The caller MUST close it.
func openBench(nodes []string, size, part, blocks, depth int) (*bench, error) {
	st, err := remote.NewRedis(remote.RedisConfig{Addrs: nodes})
	if err != nil {
		return nil, err
	}
	c, err := remote.New(remote.Config{Store: st, Prefix: "bench:tier:", BlockBytes: size, PartBytes: part,
		QueueBlocks: blocks, Writers: depth, OpTimeout: 10 * time.Second})
	if err != nil {
		st.Close()
		return nil, err
	}
	small, err := remote.New(remote.Config{Store: st, Prefix: "bench:small:", BlockBytes: smallBytes, OpTimeout: 10 * time.Second})
	if err != nil {
		c.Close()
		st.Close()
		return nil, err
	}
	b := &bench{st: st, c: c, small: small, size: size, blocks: blocks, depth: depth}
	b.payloads = make([][]byte, blocks)
	for i := range b.payloads {
		b.payloads[i] = make([]byte, size)
		r := rand.New(rand.NewPCG(uint64(i), 1))
		for j := 0; j+8 <= len(b.payloads[i]); j += 8 {
			v := r.Uint64()
			for k := range 8 {
				b.payloads[i][j+k] = byte(v >> (8 * k))
			}
		}
	}
	return b, nil
}

// close closes the caches and the client.
func (b *bench) close() {
	b.small.Close()
	b.c.Close()
	b.st.Close()
}

// timeRounds runs a warm-up round, not recorded, then rounds timed ones of
// every case, raw first on even rounds and tier first on odd ones, and
// returns each case's samples: GiB/s for the rates, microseconds per call
// for the latencies.
func (b *bench) timeRounds(rounds int) (map[string][]float64, error) {
	cases := [3][2]struct {
		name string
		fn   func(round int) (float64, error)
	}{
		{{"raw SET", b.rate(b.rawSet)}, {"tier write", b.rate(b.tierWrite)}},
		{{"raw GET", b.rate(b.rawGet)}, {"tier read", b.rate(b.tierRead)}},
		{{"raw GET latency", b.rawGetSmall}, {"tier read latency", b.tierReadSmall}},
	}
	samples := map[string][]float64{}
	for round := -1; round < rounds; round++ {
		for _, pair := range cases {
			order := []int{0, 1}
			if round%2 != 0 {
				order = []int{1, 0}
			}
			for _, k := range order {
				v, err := pair[k].fn(round + 1)
				if err != nil {
					return nil, fmt.Errorf("%s, round %d: %w", pair[k].name, round, err)
				}
				if round >= 0 {
					samples[pair[k].name] = append(samples[pair[k].name], v)
				}
			}
		}
		if err := b.cleanup(round + 1); err != nil {
			return nil, err
		}
	}
	return samples, nil
}

// addRows adds each case's samples to f, and the tier's ratio to raw
// within each round.
func addRows(f *results.File, samples map[string][]float64) {
	f.Add("raw SET", "GiB/s", samples["raw SET"], "")
	f.Add("tier write", "GiB/s", samples["tier write"], "raw SET")
	f.Add("raw GET", "GiB/s", samples["raw GET"], "")
	f.Add("tier read", "GiB/s", samples["tier read"], "raw GET")
	f.Add("raw GET latency", "us", samples["raw GET latency"], "")
	f.Add("tier read latency", "us", samples["tier read latency"], "raw GET latency")
	// The machine's load moves both sides of a pair together; the ratio
	// within each round shows the tier's cost with less of that noise.
	perRound := func(tier, raw string) []float64 {
		r := make([]float64, len(samples[tier]))
		for i := range r {
			r[i] = samples[tier][i] / samples[raw][i]
		}
		return r
	}
	f.Add("tier write / raw SET, same round", "ratio", perRound("tier write", "raw SET"), "")
	f.Add("tier read / raw GET, same round", "ratio", perRound("tier read", "raw GET"), "")
}

// notes describe the run: its shape, the cluster, the machine and its
// load, and the tier's counters.
func (b *bench) notes(o options, nodes int, loadStart string) []string {
	s := b.c.Stats()
	return []string{
		fmt.Sprintf("%d blocks of %s per pass, tier parts of %s, %d in flight, %d rounds after a warm-up round; raw and tier alternate which goes first", o.blocks, o.block, o.part, o.depth, o.rounds),
		fmt.Sprintf("latency: the median of %d calls of one %d-byte value (raw GET) or block (tier read), one at a time", smallCalls, smallBytes),
		fmt.Sprintf("one rueidis client (%d nodes given) for both; cluster: %s", nodes, clusterNote(o.addrs)),
		fmt.Sprintf("machine: %d CPUs (GOMAXPROCS %d), %s/%s; load average (1, 5, 15 min) %s at the start, %s at the end", runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, loadStart, loadAvg()),
		fmt.Sprintf("tier stats: %d hits, %d misses, %d written, %d deduplicated, %d dropped (queue full), %d write errors", s.Hits, s.Misses, s.Written, s.Deduplicated, s.DroppedFull, s.WriteErrors),
	}
}

func clusterNote(addrs string) string {
	if addrs == "" {
		return "six local redis-server nodes (3 masters, 3 replicas) on loopback, started by the benchmark"
	}
	return addrs
}

type bench struct {
	st       *remote.Redis
	c        *remote.Cache
	small    *remote.Cache // smallBytes blocks, for the latency
	size     int
	blocks   int
	depth    int
	payloads [][]byte
}

func rawKey(round, i int) string { return fmt.Sprintf("bench:raw:%d:%d", round, i) }

func (b *bench) meta(round, i int) remote.BlockMeta {
	return remote.BlockMeta{Key: uint64(round)<<32 | uint64(i), Parent: uint64(i), Salt: 1, Position: i}
}

// parallel runs fn(g, i) for every block i from b.depth goroutines g.
func (b *bench) parallel(fn func(g, i int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, b.depth)
	start := time.Now()
	for g := range b.depth {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= b.blocks {
					return
				}
				if err := fn(g, i); err != nil && errs[g] == nil {
					errs[g] = err
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return d, nil
}

func (b *bench) rawSet(round int) (time.Duration, error) {
	cl := b.st.Client()
	return b.parallel(func(g, i int) error {
		return cl.Do(context.Background(), cl.B().Set().Key(rawKey(round, i)).Value(rueidis.BinaryString(b.payloads[i])).Build()).Error()
	})
}

func (b *bench) rawGet(round int) (time.Duration, error) {
	cl := b.st.Client()
	return b.parallel(func(g, i int) error {
		v, err := cl.Do(context.Background(), cl.B().Get().Key(rawKey(round, i)).Build()).AsBytes()
		if err == nil && len(v) != b.size {
			err = fmt.Errorf("GET %s: %d bytes, want %d", rawKey(round, i), len(v), b.size)
		}
		return err
	})
}

func (b *bench) tierWrite(round int) (time.Duration, error) {
	before := b.c.Stats().Written
	start := time.Now()
	for i := range b.blocks {
		ok, err := b.c.Put(b.meta(round, i), b.payloads[i])
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, fmt.Errorf("block %d not queued: %+v", i, b.c.Stats())
		}
	}
	if err := b.c.Flush(context.Background()); err != nil {
		return 0, err
	}
	d := time.Since(start)
	if got := b.c.Stats().Written - before; got != uint64(b.blocks) {
		return 0, fmt.Errorf("%d of %d blocks written: %+v", got, b.blocks, b.c.Stats())
	}
	return d, nil
}

func (b *bench) tierRead(round int) (time.Duration, error) {
	dsts := make([][]byte, b.depth)
	for i := range dsts {
		dsts[i] = make([]byte, b.size)
	}
	return b.parallel(func(g, i int) error {
		ops := []remote.ReadOp{{Meta: b.meta(round, i), Dst: dsts[g]}}
		b.c.Get(context.Background(), ops)
		return ops[0].Err
	})
}

// cleanup deletes what round wrote, outside the timing.
func (b *bench) cleanup(round int) error {
	keys := make([]string, b.blocks)
	for i := range keys {
		keys[i] = rawKey(round, i)
	}
	if err := b.st.Delete(context.Background(), keys); err != nil {
		return err
	}
	for i := range b.blocks {
		if err := b.c.Delete(context.Background(), b.meta(round, i).Key); err != nil {
			return err
		}
	}
	return nil
}

// rate turns a pass's time into GiB/s of payload.
func (b *bench) rate(pass func(round int) (time.Duration, error)) func(int) (float64, error) {
	return func(round int) (float64, error) {
		d, err := pass(round)
		if err != nil {
			return 0, err
		}
		return float64(b.blocks) * float64(b.size) / (1 << 30) / d.Seconds(), nil
	}
}

// The latency cases: smallCalls calls of one smallBytes value each, one at
// a time, on values written once before the rounds.
const (
	smallBytes = 4096
	smallCalls = 200
)

func smallKey(i int) string { return fmt.Sprintf("bench:rawsmall:%d", i) }

func (b *bench) smallMeta(i int) remote.BlockMeta {
	return remote.BlockMeta{Key: 1<<62 | uint64(i), Parent: uint64(i), Salt: 1, Position: i}
}

func (b *bench) writeSmall() error {
	cl := b.st.Client()
	for i := range smallCalls {
		v := b.payloads[0][:smallBytes]
		if err := cl.Do(context.Background(), cl.B().Set().Key(smallKey(i)).Value(rueidis.BinaryString(v)).Build()).Error(); err != nil {
			return err
		}
		if ok, err := b.small.Put(b.smallMeta(i), v); err != nil || !ok {
			return fmt.Errorf("small block %d: queued %v, %v", i, ok, err)
		}
		if i%32 == 31 {
			if err := b.small.Flush(context.Background()); err != nil {
				return err
			}
		}
	}
	return b.small.Flush(context.Background())
}

// deleteSmall deletes what writeSmall wrote (best effort, at exit).
func (b *bench) deleteSmall() {
	keys := make([]string, smallCalls)
	for i := range keys {
		keys[i] = smallKey(i)
		b.small.Delete(context.Background(), b.smallMeta(i).Key)
	}
	b.st.Delete(context.Background(), keys)
}

// medianMicros times each call and returns the median in microseconds.
func medianMicros(call func(i int) error) (float64, error) {
	t := make([]float64, smallCalls)
	for i := range t {
		start := time.Now()
		if err := call(i); err != nil {
			return 0, err
		}
		t[i] = float64(time.Since(start).Nanoseconds()) / 1e3
	}
	return results.Median(t), nil
}

func (b *bench) rawGetSmall(int) (float64, error) {
	cl := b.st.Client()
	return medianMicros(func(i int) error {
		v, err := cl.Do(context.Background(), cl.B().Get().Key(smallKey(i)).Build()).AsBytes()
		if err == nil && len(v) != smallBytes {
			err = fmt.Errorf("GET %s: %d bytes, want %d", smallKey(i), len(v), smallBytes)
		}
		return err
	})
}

func (b *bench) tierReadSmall(int) (float64, error) {
	dst := make([]byte, smallBytes)
	return medianMicros(func(i int) error {
		ops := []remote.ReadOp{{Meta: b.smallMeta(i), Dst: dst}}
		b.small.Get(context.Background(), ops)
		return ops[0].Err
	})
}

// loadAvg is /proc/loadavg's first three fields: how busy the machine was
// besides the benchmark, or "unknown".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}
