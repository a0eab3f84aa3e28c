package remote

import (
	"context"
	"errors"
	"time"
)

// Store is what the remote tier needs of a shared key-value store. It is
// small on purpose: a Redis Cluster implements it (Redis), and so could an
// S3-compatible object store or Mooncake Store. A Store moves bytes; it
// knows nothing of blocks, checksums or tenants (the Tier above it does).
//
// Implementations MUST be safe for concurrent use. They MUST NOT keep a
// reference to a Value of a PutOp after Put returns, nor write into a Dst
// of a GetOp after Get returns.
type Store interface {
	// Get reads each op's keys. The keys of one op share a hash tag (one
	// shard) and SHOULD be read in one round trip; several ops SHOULD be
	// pipelined together. Value i of an op is copied into Dst[i] and
	// Got[i] is set to its length, or to -1 when the key is absent (an
	// empty value may count as absent: the tier writes none). A value
	// longer than Dst[i] is not copied and Got[i] is more than len(Dst[i]);
	// the store SHOULD NOT read more of it than len(Dst[i])+1 bytes, so
	// that an oversized value costs no more memory than a right one. A
	// failure (timeout, lost connection) is op.Err; an absent key is not a
	// failure. ctx's deadline bounds the whole call.
	Get(ctx context.Context, ops []GetOp)
	// Put writes each op's values under its keys, in order, with the op's
	// TTL (0: none). A store that refuses a write for want of memory
	// reports ErrStoreFull in op.Err.
	Put(ctx context.Context, ops []PutOp)
	// Exists sets found[i] to whether keys[i] exists.
	Exists(ctx context.Context, keys []string, found []bool) error
	// Delete removes the keys (absent keys are no error).
	Delete(ctx context.Context, keys []string) error
	// Close releases the store's connections.
	Close() error
}

// GetOp is one block's read: its keys, one shard.
type GetOp struct {
	Keys []string
	Dst  [][]byte
	Got  []int
	Err  error
}

// PutOp is one block's write: its keys and values, one shard.
type PutOp struct {
	Keys   []string
	Values [][]byte
	TTL    time.Duration
	Err    error
}

// Errors. Test them with errors.Is.
var (
	// ErrConfig marks an invalid Config or RedisConfig; the error names
	// the field.
	ErrConfig = errors.New("remote: invalid config")
	// ErrBadInput marks invalid arguments (a Dst of the wrong size).
	ErrBadInput = errors.New("remote: bad input")
	// ErrStoreFull means the store refused a write for want of memory
	// (Redis at maxmemory with noeviction).
	ErrStoreFull = errors.New("remote: store is full")
	// ErrMiss marks a read that found no usable block; the wrapping error
	// says why (absent, corrupt, unavailable, timeout). A miss is normal:
	// the remote tier is a lossy shared cache.
	ErrMiss = errors.New("remote: miss")
	// ErrCorrupt, wrapped with ErrMiss, marks a value whose header or
	// checksum did not match the block asked for. The value is deleted.
	ErrCorrupt = errors.New("remote: value does not match its block")
	// ErrUnavailable, wrapped with ErrMiss, marks a read refused because
	// the circuit breaker is open, or failed because the store did not
	// answer.
	ErrUnavailable = errors.New("remote: store unavailable")
	// ErrClosed marks a call after Close.
	ErrClosed = errors.New("remote: closed")
)
