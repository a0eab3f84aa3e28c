// Package remotetier connects a kvtier.Manager to a remote tier shared by
// many servers (kvtier/remote: a Redis Cluster), the tier behind NVMe or
// instead of it, through the manager's public API only.
//
// The remote tier is not one of the manager's tiers: the manager tracks no
// residency there and never evicts into it, because it is a lossy shared
// cache that other servers and the store's own eviction change at any
// time. So it is never the only copy of a block: a block goes there only
// as a copy of one still in the host tier (Publish), and comes back into
// the host tier (Fetch), from where the manager onboards it as any other
// host block.
//
// A request's path with it:
//
//	m.Lookup(salt, tokens, &l)
//	rt.Fetch(ctx, salt, tokens, &l) // the remote's blocks past l's, into
//	                                // the host tier; l looked up again
//	m.Plan(&l); m.Onboard(&l) ...   // as before
//	...
//	rt.Publish(salt, tokens, &l2)   // later, on a lease whose blocks have
//	                                // a ready host copy: write-behind
//
// It promises:
//
//   - Fetch and Publish never fail a request: a remote miss, timeout or
//     open breaker is a block recomputed, a write dropped (both counted).
//     A fetch that failed for a reason other than an absent block (the
//     store did not answer, a value did not verify) is logged at Warn, at
//     most once per reason every WarnEvery.
//   - Nothing wrong is served: a fetched block is inserted through the
//     manager, which verifies it by salt, parent and tokens like any other,
//     and the remote store verifies what it returns (kvtier/remote),
//     down to its codec: a Tier gets only blocks in its Config.Codec.
//   - A block is published only once admitted (seen twice by default) and
//     not known to be there already.
//   - The manager's event stream (kvtier.Remote) holds a block from its
//     write until this server stops knowing the remote holds it: a fetch
//     found it gone, its known set pushed it out, or the store's TTL has
//     passed (known.go). Each removal is announced once.
package remotetier
