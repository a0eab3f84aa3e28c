package remote

import (
	"fmt"
	"strings"
	"time"

	"kvtier.dev/internal/checksum"
)

// Config configures a Cache.
type Config struct {
	// Store is the shared store, for example a *Redis. The Cache does not
	// own it: Close it after the Cache.
	Store Store
	// Prefix starts every key, one per deployment (and per tenant where
	// tenants share a cluster), for example "kvt:prod:". It must not
	// contain '{' or '}' (the hash tag follows it). Empty means "kvt:".
	Prefix string
	// BlockBytes is every block's payload size, for example 2,621,440 for
	// a 16-token block of a 70B model (80 layers, K and V, fp16).
	BlockBytes int
	// PartBytes splits a payload into values of at most this size, all on
	// the block's shard, so that one large value does not hold a node's
	// event loop for long. 0 means 1 MiB.
	PartBytes int
	// ChecksumKey, when set (at least 16 bytes), keys the header, payload,
	// salt and token checksums (HMAC-SHA256, as the NVMe tier's): a value
	// written by someone without the key fails its check. Every server of
	// a deployment MUST use the same key.
	ChecksumKey []byte
	// Model names the model whose blocks the prefix holds (the weights'
	// digest or seed, the shapes, the KV dtype, the tokenizer, in one text:
	// kvtier/stack builds it). CheckModel records it in the prefix and
	// refuses a prefix that holds another model's blocks. Every server of
	// a deployment MUST give the same.
	Model string
	// OpTimeout is each read's and each write's deadline (writes: for the
	// existence check; the write itself is bounded by the store's
	// connection timeout). A read past it is a miss. 0 means 500 ms.
	OpTimeout time.Duration
	// QueueBlocks bounds the write-behind queue: Put copies a block into
	// one of this many buffers (QueueBlocks*BlockBytes of memory at most)
	// and drops it, counted, when all are taken. 0 means 64.
	QueueBlocks int
	// Writers is the number of goroutines that write the queue out. 0
	// means 4.
	Writers int
	// TTL, when set, expires values this long after their write, besides
	// the store's own eviction. 0: no expiry.
	TTL time.Duration
	// BreakerFailures consecutive failed calls open the circuit breaker:
	// reads then miss at once and writes are dropped, for BreakerCooldown,
	// after which one call probes the store. 0 means 3 failures and 1 s.
	BreakerFailures int
	BreakerCooldown time.Duration
	// Now is the clock of the breaker; nil means time.Now.
	Now func() time.Time
	// OnStored, when set, is called by a writer with each queued block it
	// wrote or found in the store already: the server announces it in its
	// cache's events (kvtier.Manager.Announce). It MUST be quick, and MUST
	// NOT keep meta.Tokens.
	OnStored func(meta BlockMeta)
}

func (c *Config) withDefaults() (Config, error) {
	d := *c
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: Config.%s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case d.Store == nil:
		return d, bad("Store", "is nil")
	case strings.ContainsAny(d.Prefix, "{}"):
		return d, bad("Prefix", "%q contains '{' or '}'", d.Prefix)
	case d.BlockBytes <= 0:
		return d, bad("BlockBytes", "%d is not positive", d.BlockBytes)
	case d.PartBytes < 0:
		return d, bad("PartBytes", "%d is negative", d.PartBytes)
	case len(d.ChecksumKey) > 0 && len(d.ChecksumKey) < checksum.MinKeyBytes:
		return d, bad("ChecksumKey", "%d bytes, want at least %d", len(d.ChecksumKey), checksum.MinKeyBytes)
	case d.OpTimeout < 0:
		return d, bad("OpTimeout", "%v is negative", d.OpTimeout)
	case d.QueueBlocks < 0:
		return d, bad("QueueBlocks", "%d is negative", d.QueueBlocks)
	case d.Writers < 0:
		return d, bad("Writers", "%d is negative", d.Writers)
	case d.TTL < 0:
		return d, bad("TTL", "%v is negative", d.TTL)
	case d.BreakerFailures < 0:
		return d, bad("BreakerFailures", "%d is negative", d.BreakerFailures)
	case d.BreakerCooldown < 0:
		return d, bad("BreakerCooldown", "%v is negative", d.BreakerCooldown)
	}
	if d.Prefix == "" {
		d.Prefix = "kvt:"
	}
	if d.PartBytes == 0 {
		d.PartBytes = 1 << 20
	}
	if d.OpTimeout == 0 {
		d.OpTimeout = 500 * time.Millisecond
	}
	if d.QueueBlocks == 0 {
		d.QueueBlocks = 64
	}
	if d.Writers == 0 {
		d.Writers = 4
	}
	if d.BreakerFailures == 0 {
		d.BreakerFailures = 3
	}
	if d.BreakerCooldown == 0 {
		d.BreakerCooldown = time.Second
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	return d, nil
}

// TTL is how long after its write the store expires a value (Config.TTL);
// 0: never.
func (c *Cache) TTL() time.Duration { return c.cfg.TTL }

// probeLimit is how long the breaker waits for a probe's outcome before it
// lets another call probe: four times an op's deadline, which a read or an
// existence check never outlives, and time for a write the store's
// connection timeouts bound.
func probeLimit(d Config) time.Duration { return 4 * d.OpTimeout }
