package remote

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// RedisConfig configures the Redis Cluster backend.
type RedisConfig struct {
	// Addrs are some of the cluster's nodes, host:port; the client learns
	// the rest from them. Example: []string{"10.0.0.5:6379", "10.0.0.6:6379"}.
	Addrs []string
	// Username and Password are the ACL user's (Redis 6+). A deployment
	// SHOULD have a user of its own limited to its key prefix, for example
	// "ACL SETUSER kvt-prod on >secret ~kvt:prod:* +getrange +set +exists
	// +del +ping +cluster|slots +cluster|shards +hello" (the client does not
	// send CLIENT SETINFO, so the list is the same on every Redis version).
	// Empty: the default user.
	Username, Password string
	// TLS, when set, encrypts the connections (and, with client
	// certificates, authenticates them). Nil: plain TCP.
	TLS *tls.Config
	// ConnWriteTimeout bounds how long a connection waits for the
	// answers to what it sent before it is closed as broken; it is what
	// bounds writes (Put), which run without a context deadline so that
	// no value buffer is released while still queued for sending. 0 means
	// 2 s.
	ConnWriteTimeout time.Duration
	// DialTimeout bounds one connection attempt. 0 means 2 s.
	DialTimeout time.Duration
	// RefreshInterval is how often the client re-reads the cluster's
	// topology, besides after a MOVED answer or a broken connection, so
	// that it finds a promoted replica soon after a failover. 0 means 1 s.
	RefreshInterval time.Duration
	// PipelineMultiplex: 2^n connections per node carry the pipelined
	// commands. 0 means 2 (4 connections), enough to keep a loopback node
	// busy with 2 MiB values.
	PipelineMultiplex int
}

// Redis is the Redis Cluster backend of Store, on the rueidis client (its
// automatic pipelining sends the reads of many blocks, and the parts of
// one block, in one round trip per node without a goroutine per command).
type Redis struct {
	c rueidis.Client
}

// NewRedis connects to the cluster and checks that it answers.
func NewRedis(cfg RedisConfig) (*Redis, error) {
	if len(cfg.Addrs) == 0 {
		return nil, fmt.Errorf("%w: RedisConfig.Addrs is empty", ErrConfig)
	}
	for i, a := range cfg.Addrs {
		if !strings.Contains(a, ":") {
			return nil, fmt.Errorf("%w: RedisConfig.Addrs[%d] %q is not host:port", ErrConfig, i, a)
		}
	}
	if cfg.ConnWriteTimeout < 0 || cfg.DialTimeout < 0 || cfg.RefreshInterval < 0 {
		return nil, fmt.Errorf("%w: RedisConfig timeouts must not be negative (ConnWriteTimeout %v, DialTimeout %v, RefreshInterval %v)",
			ErrConfig, cfg.ConnWriteTimeout, cfg.DialTimeout, cfg.RefreshInterval)
	}
	if cfg.PipelineMultiplex < 0 || cfg.PipelineMultiplex > rueidis.MaxPipelineMultiplex {
		return nil, fmt.Errorf("%w: RedisConfig.PipelineMultiplex %d is not in [0, %d]", ErrConfig, cfg.PipelineMultiplex, rueidis.MaxPipelineMultiplex)
	}
	orDefault := func(d, def time.Duration) time.Duration {
		if d == 0 {
			return def
		}
		return d
	}
	mux := cfg.PipelineMultiplex
	if mux == 0 {
		mux = 2
	}
	opt := rueidis.ClientOption{
		// A copy: ShuffleInit shuffles it in place, and the client reads
		// it again on every topology refresh, while the caller may share
		// the slice with another client.
		InitAddress:       slices.Clone(cfg.Addrs),
		Username:          cfg.Username,
		Password:          cfg.Password,
		TLSConfig:         cfg.TLS,
		DisableCache:      true,
		ClientSetInfo:     rueidis.DisableClientSetInfo,
		ShuffleInit:       true,
		PipelineMultiplex: mux,
		ConnWriteTimeout:  orDefault(cfg.ConnWriteTimeout, 2*time.Second),
		Dialer:            net.Dialer{Timeout: orDefault(cfg.DialTimeout, 2*time.Second), KeepAlive: time.Second},
		ClusterOption:     rueidis.ClusterOption{ShardsRefreshInterval: orDefault(cfg.RefreshInterval, time.Second)},
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("remote: connecting to redis %v: %w", cfg.Addrs, err)
	}
	return &Redis{c: c}, nil
}

// Client is the underlying client, for tools and tests that compare the
// tier with plain commands on the same connections.
func (r *Redis) Client() rueidis.Client { return r.c }

// Get implements Store. Each value is read with GETRANGE up to one byte
// past its Dst, so that an oversized value (planted, or another
// deployment's) is never read whole: two 200 MB values cost 200 MB of
// memory each when read with GET. GETRANGE answers an absent key with an
// empty string, which the tier never writes: that is an absent key. The
// reads of all ops go out in one DoMulti, which rueidis groups by node and
// pipelines; an op's keys share a slot.
func (r *Redis) Get(ctx context.Context, ops []GetOp) {
	n := 0
	for i := range ops {
		n += len(ops[i].Keys)
	}
	cmds := make(rueidis.Commands, 0, n)
	for i := range ops {
		for k, key := range ops[i].Keys {
			cmds = append(cmds, r.c.B().Getrange().Key(key).Start(0).End(int64(len(ops[i].Dst[k]))).Build())
		}
	}
	res := r.c.DoMulti(ctx, cmds...)
	j := 0
	for i := range ops {
		op := &ops[i]
		op.Err = nil
		for k := range op.Keys {
			m := res[j]
			j++
			b, err := m.AsBytes()
			switch {
			case rueidis.IsRedisNil(err) || err == nil && len(b) == 0:
				op.Got[k] = -1
			case err != nil:
				if op.Err == nil {
					op.Err = fmt.Errorf("GETRANGE %s: %w", op.Keys[k], err)
				}
				op.Got[k] = -1
			default:
				op.Got[k] = len(b)
				if len(b) <= len(op.Dst[k]) {
					copy(op.Dst[k], b)
				}
			}
		}
	}
}

// Put implements Store. Values are sent without a copy and without a
// context deadline (ConnWriteTimeout bounds them): a command whose
// deadline fired while still queued would otherwise be written later from
// a buffer its caller had already reused. ctx is checked before sending.
func (r *Redis) Put(ctx context.Context, ops []PutOp) {
	if err := ctx.Err(); err != nil {
		for i := range ops {
			ops[i].Err = err
		}
		return
	}
	n := 0
	for i := range ops {
		n += len(ops[i].Keys)
	}
	cmds := make(rueidis.Commands, 0, n)
	for i := range ops {
		op := &ops[i]
		for k, key := range op.Keys {
			v := rueidis.BinaryString(op.Values[k])
			if op.TTL > 0 {
				cmds = append(cmds, r.c.B().Set().Key(key).Value(v).Px(op.TTL).Build())
			} else {
				cmds = append(cmds, r.c.B().Set().Key(key).Value(v).Build())
			}
		}
	}
	res := r.c.DoMulti(context.Background(), cmds...)
	j := 0
	for i := range ops {
		op := &ops[i]
		op.Err = nil
		for k := range op.Keys {
			if err := res[j].Error(); err != nil && op.Err == nil {
				op.Err = fmt.Errorf("SET %s: %w", op.Keys[k], mapErr(err))
			}
			j++
		}
	}
}

// mapErr turns Redis's refusal for want of memory into ErrStoreFull.
func mapErr(err error) error {
	if re, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(re.Error(), "OOM") {
		return fmt.Errorf("%w: %w", ErrStoreFull, err)
	}
	return err
}

// Exists implements Store.
func (r *Redis) Exists(ctx context.Context, keys []string, found []bool) error {
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = r.c.B().Exists().Key(k).Build()
	}
	var first error
	for i, res := range r.c.DoMulti(ctx, cmds...) {
		n, err := res.AsInt64()
		if err != nil && first == nil {
			first = fmt.Errorf("EXISTS %s: %w", keys[i], err)
		}
		found[i] = err == nil && n > 0
	}
	return first
}

// Delete implements Store. Each key goes in its own DEL, so keys of
// different slots may be mixed.
func (r *Redis) Delete(ctx context.Context, keys []string) error {
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = r.c.B().Del().Key(k).Build()
	}
	var errs []error
	for i, res := range r.c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			errs = append(errs, fmt.Errorf("DEL %s: %w", keys[i], err))
		}
	}
	return errors.Join(errs...)
}

// Close implements Store.
func (r *Redis) Close() error {
	r.c.Close()
	return nil
}
