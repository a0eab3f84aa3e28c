// Package nvme is kvtier's third tier: fixed-size block slots in preallocated
// slab files on local NVMe drives, read and written with O_DIRECT straight
// from and into the caller's (pinned) memory, and checked on every read.
//
// What it promises:
//
//   - It never returns a torn, bit-flipped or foreign block as checked. Every
//     slot starts with a header that names the block (key, parent, salt,
//     position in its prefix, token ids), the slot it belongs to, a sequence
//     number and the checksum of the payload (XXH3-64; a keyed HMAC with
//     Config.ChecksumKey; or a word sum the writer computed on the GPU,
//     WriteOp.WordSummed), and that carries its own checksum. A read
//     checks all of it before it reports success; a mismatch drops the slot,
//     is counted in Stats, and is returned as a miss (errors.Is(err,
//     ErrNotFound) and ErrCorrupt). The one exception is asked for: with
//     ReadOp.DeferWordSum a word-summed payload is returned unchecked and
//     marked so (ReadOp.Deferred), with the sum it must have; the caller
//     checks it where the bytes go (the GPU) and reports a failure
//     (ReportCorrupt), which drops the slot as the store's own check does.
//     Checking payloads on the CPU costs a pass over cold memory: 2 to 5
//     times the CPU of the raw I/O on the H200 machine, where the GPU's
//     check keeps the tier within 1.4 times
//     (benchmarks/results/nvme-h200.md).
//   - A block is read only in the codec it was written in. Its header
//     records the payload's codec (BlockMeta.Codec, a kvtier/codec.Codec
//     value: 0 None, 1 FP8E4M3PerHead), and a read names the codec it
//     decodes (ReadOp.WantCodec): a block in another is a miss (ErrNotFound
//     and ErrCodec) and stays; a header whose codec differs from the one
//     the block was written in is corrupt. Open keeps blocks of every
//     codec and Range lists each one's: the caller adopts those it
//     decodes and frees the rest. Headers written before codecs read as
//     None (see header.go).
//   - A block is readable only after its write completed (and, with
//     Config.Durable, was synced). A slot is never reused while an I/O on it
//     is in flight: Free and Write refuse a busy slot with ErrBusy.
//   - A slot found corrupt, at Read or at Open, has its header cleared on
//     disk (and synced), so that no restart adopts it again: one bad block
//     costs one recompute, not a crash loop (Stats.SlotsInvalidated).
//   - Only this user's processes can change the tier, one Store at a time:
//     Open creates a missing directory with mode 0700 and refuses one that
//     is a symbolic link (O_NOFOLLOW), that another user owns or that group
//     or others may write, or whose parent another user could change (not
//     this user's or root's, or writable by group or others without the
//     sticky bit). It opens every file relative to the directory's fd with
//     O_NOFOLLOW (a planted symbolic link is refused, ErrUnsafeDir),
//     refuses a slab file that group or others may read or write (unless
//     Config.Reformat, which empties it and makes it 0600), makes the lock
//     file 0600, and holds an exclusive flock on kvtier.lock until Close
//     (a second Store fails with ErrLocked naming the holder's pid).
//   - Slot headers are summed under a random key that each directory keeps
//     in kvtier.key (mode 0600), or under Config.ChecksumKey: a header
//     written by anyone who cannot read the key, or a slab file brought
//     from another directory, fails its check. Payload sums stay XXH3 or
//     word sums (checked on the GPU) unless Config.ChecksumKey keys them
//     too: against a forger who can write the slab files anyway (a shared
//     or restored disk), set it.
//   - The tier is bound to one model (Config.Model: the weights, shapes,
//     KV dtype and tokenizer): each slab file records it, and a file
//     written for another model has its slots cleared at Open, before any
//     is read (Info.Cleared names them and the model they held). A file
//     Open cannot use (a superblock that does not decode, another geometry
//     or superblock version) fails Open, changing nothing, unless
//     Config.Reformat empties and reformats it.
//   - A restart keeps the warm tier: Open scans the slot headers in parallel,
//     verifies each and rebuilds the key index; corrupt or foreign slots are
//     dropped and counted, the rest stays, and Range lists it for the block
//     manager to adopt (kvtier.DeviceMoverConfig.KeepBlocks, Manager.Adopt).
//   - Bad input (config, slot number, buffer size or alignment) gets an error
//     that names what was wrong and changes nothing.
//
// Crash safety. A crash can leave any subset of a write's sectors on disk.
// A header is trusted only if its own checksum holds, and its block only if
// the payload on disk hashes to the payload checksum in that header. So:
//
//   - a new header over an old or half-written payload fails the payload
//     check; an old header over a new or half-written payload fails it too,
//     unless the new payload is byte-for-byte the old one (then the data is
//     right anyway) or the 64-bit checksum collides (about 2^-64 for
//     unrelated data);
//   - a header copied to the wrong place (misdirected write, moved file)
//     fails because it names its file and slot;
//   - in durable mode a write goes in two steps: the payload with a zeroed
//     (invalid) header, fdatasync, then the header, fdatasync. A block whose
//     header reached the disk therefore has its payload on disk too, and the
//     old header is gone before any new payload byte can land: durability
//     does not rest on the checksum alone.
//
// In fast mode (the default) header and payload go out in one pwritev with
// no sync: the checksums above still guarantee that nothing wrong is ever
// served, but a block written just before a power loss may be lost.
//
// Capacity and eviction belong to the block manager: this package allocates,
// writes, reads, frees and, after a restart, lists (Range) what survived.
// A freed slot keeps its bytes on disk, so a block freed before a crash may be
// listed again by Range after it: its data is still right for its key.
package nvme
