// Package remote is kvtier's shared remote tier: KV blocks in a store that
// many servers share (Redis Cluster here; the Store contract is small so
// that an S3-compatible object store or Mooncake Store can follow), so that
// a replica finds the prefixes other replicas computed, and a restarted one
// does not start cold. It sits behind the NVMe tier, or instead of it; the
// block manager connects to it through kvtier.RemoteTier.
//
// What it promises:
//
//   - It never returns a block other than the one asked for. A block is
//     stored as a header and its payload parts, under keys that share a
//     hash tag (one shard, one round trip). The header carries a format
//     version, the block's key, parent key and position, digests of the
//     salt and of the token ids, the payload's codec (BlockMeta.Codec), size
//     and checksum, and its own checksum (XXH3-64, or HMAC-SHA256 under Config.ChecksumKey, as
//     the NVMe tier's). A read checks all of it against what the caller
//     asked for; a mismatch, a short or missing part, or a payload whose
//     checksum differs is a miss, counted (Stats.Corrupt, Incomplete), and
//     the value is deleted. A value is read at most one byte past its
//     expected size (GETRANGE), so an oversized one costs no memory.
//     A block is served only in the codec asked for: a header naming
//     another is a corrupt value, deleted (and a Put of a block the store
//     holds in another codec is deduplicated until that read deletes it).
//   - A prefix holds one model's blocks: CheckModel records Config.Model
//     (the weights, shapes, KV dtype, tokenizer) in <prefix>model and
//     refuses a prefix that another model, or another deployment's
//     ChecksumKey, wrote (ErrOtherModel).
//   - A read never fails a request and never waits long: reads are
//     pipelined, under one deadline (Config.OpTimeout); an error, timeout
//     or store that does not answer is a miss. After BreakerFailures
//     failed calls in a row a circuit breaker turns the tier off (reads
//     miss at once, writes are dropped) and probes the store again every
//     BreakerCooldown; its first success turns it back on. A probe that
//     has not answered within 4 × OpTimeout is taken as lost, and the next
//     call probes: one hung call does not keep the tier off.
//   - A write never slows a request: Put copies the block into a bounded
//     queue and returns; writers send it behind the request. A block queued
//     already, or that the store holds already (one EXISTS), is not sent
//     again; when the queue is full, or the breaker open, the block is
//     dropped and counted.
//   - The store may lose anything at any time (its own eviction policy,
//     TTLs, a failover that lost the last writes): a miss is normal, and
//     the manager never treats the remote tier as the only copy of a
//     block. A store that refuses writes for want of memory makes misses,
//     not errors (Stats.Rejected).
//
// # What a tenant sharing the cluster can and cannot learn
//
// Keys are named <prefix>{<block key>}h and <prefix>{<block key>}<part>,
// where the block key is kvtier's chained hash of the salt, the parent key
// and the block's token ids. Headers hold the salt and the token ids only
// as digests. So:
//
//   - Without the salt, a key name says nothing useful about the tokens,
//     and the same prompt under two salts gives unrelated keys: tenants
//     with different salts never hit each other's blocks, even in one
//     prefix. A tenant's salt is its secret. The chained hash is XXH3,
//     which is fast, not cryptographic: against a determined adversary it
//     is the ACLs below, not the hash, that keep tenants apart.
//   - Whoever knows a salt can compute the keys of any token sequence and
//     ask whether it is cached (EXISTS): that is, learn whether someone
//     with that salt sent that prefix recently.
//   - The payload is the KV cache in clear. Whoever can read a value can
//     recover much of the prompt from it with the model's weights. Read
//     access to a prefix's values is read access to its prompts.
//   - Whoever can write a prefix can overwrite its values. Without
//     Config.ChecksumKey a writer that can also read can forge a value that
//     verifies (the checksums are public functions); with a key that only
//     the deployment's servers hold, forged or foreign values fail their
//     check and are deleted. A writer can always delete values, which costs
//     recomputation, never wrong KV.
//
// Hence, on a cluster that several tenants or deployments share: give each
// its own key prefix (Config.Prefix) and an ACL user limited to it and to
// the commands the tier uses (see RedisConfig.Username: with "~prefix*" a
// user can neither read, write nor list another prefix's keys, and without
// +@admin, KEYS, SCAN over others, INFO or CONFIG it cannot see the
// keyspace); set a ChecksumKey per deployment; and use TLS (RedisConfig.TLS)
// where the network is not trusted, since without it anyone on the path
// sees keys and values. What a tenant confined so can still observe is what
// shared capacity shows: its own blocks evicted sooner when others fill the
// cluster, and the cluster's latency.
package remote
