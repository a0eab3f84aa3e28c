package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"kvtier.dev/internal/bytesize"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/remote"
)

// probeRemoteConfig is `kvtier probe --remote`'s: the cluster, and the
// blocks it moves through the remote tier.
type probeRemoteConfig struct {
	addrs      []string
	blockBytes int64
	blocks     int // per pass
	depth      int // fetches in flight
}

// probeRemoteSmall is the block size of the latency figure: small enough
// that its time is the round trip, not the bytes.
const probeRemoteSmall = 4096

// probeRemoteCalls is how many single fetches one round's latency is the
// median of.
const probeRemoteCalls = 50

// probeRemote measures the remote tier as a server would use it, through
// kvtier/remote over the Redis Cluster at cfg.addrs: each round writes a
// pass of blocks (Put, then Flush: "tier write"), fetches them from
// cfg.depth goroutines ("tier read": header and parts in one round trip,
// checksums verified), deletes them, and fetches one small block at a time
// ("tier read latency"). "tier read" and its latency are what `kvtier
// replay --remote-link` reads. The keys are the probe's own and are
// deleted.
func probeRemote(ctx context.Context, pc probeRemoteConfig, cfg probeConfig, stdout io.Writer) (*results.File, error) {
	st, err := remote.NewRedis(remote.RedisConfig{Addrs: pc.addrs})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	prefix := fmt.Sprintf("kvtier-probe:%d:%d:", os.Getpid(), time.Now().UnixNano())
	c, err := remote.New(remote.Config{Store: st, Prefix: prefix, BlockBytes: int(pc.blockBytes),
		QueueBlocks: pc.blocks, Writers: pc.depth, OpTimeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	small, err := remote.New(remote.Config{Store: st, Prefix: prefix + "small:", BlockBytes: probeRemoteSmall, OpTimeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	defer small.Close()

	payload := make([]byte, pc.blockBytes)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	meta := func(round, i int) remote.BlockMeta {
		return remote.BlockMeta{Key: uint64(round+2)<<32 | uint64(i), Parent: uint64(i), Salt: 1, Position: i}
	}
	fmt.Fprintf(stdout, "remote tier at %s: %d blocks of %s per pass, %d fetches in flight, %d rounds after a warm-up\n",
		strings.Join(pc.addrs, ","), pc.blocks, bytesize.Format(pc.blockBytes), pc.depth, cfg.runs)
	if err := probeRemoteWriteSmall(ctx, small, payload[:probeRemoteSmall]); err != nil {
		return nil, err
	}
	var write, read, latency []float64
	passGiB := float64(pc.blocks) * float64(pc.blockBytes) / (1 << 30)
	dsts := make([][]byte, pc.depth)
	for i := range dsts {
		dsts[i] = make([]byte, pc.blockBytes)
	}
	for round := -1; round < cfg.runs; round++ { // round -1 warms up
		start := time.Now()
		for i := range pc.blocks {
			if ok, err := c.Put(meta(round, i), payload); err != nil || !ok {
				return nil, fmt.Errorf("write block %d: queued %v, %v (%+v)", i, ok, err, c.Stats())
			}
		}
		if err := c.Flush(ctx); err != nil {
			return nil, fmt.Errorf("write: %w", err)
		}
		w := time.Since(start)
		r, err := probeRemoteFetch(ctx, c, pc, dsts, func(i int) remote.BlockMeta { return meta(round, i) })
		if err != nil {
			return nil, err
		}
		for i := range pc.blocks {
			if err := c.Delete(ctx, meta(round, i).Key); err != nil {
				return nil, fmt.Errorf("delete block %d: %w", i, err)
			}
		}
		l, err := probeRemoteLatency(ctx, small)
		if err != nil {
			return nil, err
		}
		if round >= 0 {
			write, read, latency = append(write, passGiB/w.Seconds()), append(read, passGiB/r.Seconds()), append(latency, l)
		}
	}
	for i := range probeRemoteCalls {
		_ = small.Delete(ctx, probeRemoteSmallMeta(i).Key) // best effort: the figures are taken
	}
	f := results.New("probe-remote", cfg.machine, cfg.commit)
	f.Command = cfg.command
	f.Add("tier write", "GiB/s", write, "")
	f.Add("tier read", "GiB/s", read, "")
	f.Add("tier read latency", "us", latency, "")
	f.Notes = append(f.Notes,
		fmt.Sprintf("kvtier/remote over the Redis Cluster at %s: %d blocks of %s per pass, %d fetches in flight (header and parts in one round trip, checksums verified); latency: the median of %d fetches of one %d-byte block, one at a time", strings.Join(pc.addrs, ","), pc.blocks, bytesize.Format(pc.blockBytes), pc.depth, probeRemoteCalls, probeRemoteSmall),
		fmt.Sprintf("tier stats: %+v", c.Stats()))
	return f, nil
}

// probeRemoteFetch fetches the pass's blocks from pc.depth goroutines and
// returns the time it took; a miss is an error (the blocks were just
// written).
func probeRemoteFetch(ctx context.Context, c *remote.Cache, pc probeRemoteConfig, dsts [][]byte, meta func(i int) remote.BlockMeta) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, pc.depth)
	start := time.Now()
	for g := range pc.depth {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < pc.blocks; i = int(next.Add(1) - 1) {
				ops := []remote.ReadOp{{Meta: meta(i), Dst: dsts[g]}}
				c.Get(ctx, ops)
				if ops[0].Err != nil && errs[g] == nil {
					errs[g] = fmt.Errorf("read block %d: %w", i, ops[0].Err)
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

func probeRemoteSmallMeta(i int) remote.BlockMeta {
	return remote.BlockMeta{Key: 1<<62 | uint64(i), Parent: uint64(i), Salt: 1, Position: i}
}

// probeRemoteWriteSmall writes the latency figure's small blocks.
func probeRemoteWriteSmall(ctx context.Context, small *remote.Cache, v []byte) error {
	for i := range probeRemoteCalls {
		if ok, err := small.Put(probeRemoteSmallMeta(i), v); err != nil || !ok {
			return fmt.Errorf("write small block %d: queued %v, %v", i, ok, err)
		}
		if err := small.Flush(ctx); err != nil {
			return fmt.Errorf("write small block %d: %w", i, err)
		}
	}
	return nil
}

// probeRemoteLatency is the median time, in microseconds, of fetching one
// small block at a time.
func probeRemoteLatency(ctx context.Context, small *remote.Cache) (float64, error) {
	dst := make([]byte, probeRemoteSmall)
	t := make([]float64, probeRemoteCalls)
	for i := range t {
		ops := []remote.ReadOp{{Meta: probeRemoteSmallMeta(i), Dst: dst}}
		start := time.Now()
		small.Get(ctx, ops)
		t[i] = float64(time.Since(start).Nanoseconds()) / 1e3
		if ops[0].Err != nil {
			return 0, fmt.Errorf("read small block %d: %w", i, ops[0].Err)
		}
	}
	return results.Median(t), nil
}
