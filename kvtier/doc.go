// Package kvtier is the block manager: it knows which KV blocks exist, where
// each lives (GPU, host, NVMe), who is using it, and what to evict. It
// decides; a Mover (kvtier/devmover on a device) copies and a Planner
// (kvtier/costplan) chooses load or recompute; kvtier/stack wires them.
//
// It promises:
//
//   - Wrong KV is never served. A hit is confirmed against the stored salt,
//     parent key, position and token ids, so a hash collision is a miss;
//     blocks looked up by key are confirmed by salt, parent and position.
//   - A block is readable from a tier only once its copy there completed,
//     and a slot is reused only after every copy that reads or writes it
//     completed.
//   - No tier holds more slots than its capacity, and a block held by a
//     Lease or a copy is never evicted.
//   - Lookups allocate nothing once the Lease has grown, and take only a
//     read lock of one stripe; metadata is plain values the garbage
//     collector never scans. Recency from lookups is approximate, within
//     bounds (docs/design-notes.md, "The block manager's concurrency").
//   - Nothing on a request's path waits on the host for a copy.
//   - With Config.Tenants, no tenant's blocks hold more slots of a tier
//     than its cap, and a full tier evicts from the tenant most over its
//     weighted share. A tier evicts its blocks of the lowest retention
//     priority first (Pin; unpinned blocks have DefaultPriority).
//   - With Config.EventBuffer, every block that becomes readable in a tier,
//     or stops being so, is announced in order (Subscribe); the manager
//     never waits for a subscriber, which loses what it falls behind.
//
// A request's path:
//
//	m.Lookup(salt, tokens, &l)  // leased prefix, best tier of each block
//	m.Plan(&l)                  // load or recompute, per block
//	m.Onboard(&l)               // copies into GPU slots (Block.GPUSlot)
//	l.LayerEvents(i, evs)       // layer i landed: the compute stream waits
//	                            // on these (or l.WaitLayer, or m.Wait for all)
//	...                         // prefill the rest, into slots from:
//	m.Insert(salt, tokens, GPU, &w); enqueue the writes of Blocks with Write
//	m.CommitAfter(&w, ev)       // ev marks them written (Commit: done already)
//	m.Offload(&w, Host)         // waits for ev on the device; or WriteThrough
//	m.Release(&w); m.Release(&l)
package kvtier
