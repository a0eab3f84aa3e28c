package stack

import (
	"fmt"
	"log/slog"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/devmover"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/transfer"
)

// Options configures Open: the common case of a server with one GPU, or
// several in tensor parallel, a pinned host tier and, optionally, an NVMe
// tier. Sizes are given once and every part gets the ones it needs.
type Options struct {
	// Device is the GPU (cudastream.Open) or the simulated device
	// (cudastream.NewSim). Required unless Shards is set. The host tier's
	// pages are bound to its NUMA node (Device.Info().NUMANode) where the
	// machine has several.
	Device cudastream.Device
	// GPU is the server's KV region: GPU slot s is block s of the layout,
	// so the GPU tier has GPU.NumBlocks slots of GPU.BlockBytes(). Required
	// unless Shards is set.
	GPU transfer.GPULayout
	// Shards makes a tensor-parallel cache over several GPUs, one entry
	// per GPU in rank order, each with its device and its KV region (its
	// share of every block); Device and GPU are then left unset. The
	// regions have the same NumBlocks and BlockBytes. Each GPU gets its
	// own parts, sized by HostBytes and NVMeBytes: a pinned pool bound to
	// its NUMA node (the pools are pinned at the same time), copy engines
	// and a store in a directory "rank<N>" of each NVMeDirs entry (made
	// 0700 if absent). One Manager decides for all of them through a
	// kvtier.ShardedMover, so a block is cached on every GPU or on none.
	Shards []Shard
	// BlockTokens is the number of tokens per block, for example 16.
	BlockTokens int
	// HostBytes sizes the pinned host tier (per GPU); each slot holds one
	// block rounded up to 4 KiB. Example: 64 GiB of 2.5 MiB blocks is
	// 26,214 slots. Required (the copy engine moves blocks through it).
	HostBytes int64
	// NVMeDirs and NVMeBytes make the NVMe tier: NVMeBytes of blocks (per
	// GPU) spread over one slab file per directory (which must exist).
	// Both or neither.
	NVMeDirs  []string
	NVMeBytes int64
	// NVMeAdmitter filters the copies the manager makes into the NVMe tier
	// by how often requests use a block (kvtier.TierConfig.Admitter), for
	// example policy.SeenTwice. Nil admits every block.
	NVMeAdmitter policy.Admitter[kvtier.Key]
	// NVMeGate, when set, builds the NVMe tier's WriteGate
	// (kvtier.TierConfig.Gate) over the drive the mover measures (rank 0's
	// with Shards): a costplan.Gate makes a write only when a load of the
	// block would be worth it, within the drive's budget.
	NVMeGate func(drive *devmover.Mover) (kvtier.WriteGate, error)
	// OnDriveIO: see devmover.Config.OnDriveIO (every rank's drive).
	OnDriveIO func(write bool, bytes int64, d time.Duration)
	// OnCodecKernel: see transfer.Config.OnCodecKernel (every rank's copy
	// engines, with a Codecs.Host): a coded transfer's launch, timed on
	// the GPU, for a calibration to learn the kernels from.
	OnCodecKernel func(transfer.CodecKernel)
	// NVMeReformat empties and formats afresh an NVMe slab file Open
	// cannot use as it is, instead of failing: a superblock that does not
	// decode, a file written with another geometry (another NVMeBytes or
	// BlockTokens, a block of another size) or that others may read or
	// write (nvme.Config.Reformat). Its blocks are lost.
	NVMeReformat bool
	// Model names the model whose KV the cache holds (its weights, shapes,
	// KV dtype and tokenizer). Every block's salt is folded with it
	// (Cache.Salt); the NVMe tier records it, and a directory written for
	// another model is cleared (logged at Warn, naming that model); the
	// remote tier records it in its prefix and Open refuses a prefix that
	// holds another model's blocks. Zero: no model named, and tiers
	// written for a named one are cleared or refused just the same.
	Model Model
	// Remote, if set, adds the shared remote tier behind the host tier
	// (Cache.Remote). Not with Shards yet.
	Remote *RemoteOptions
	// KeepNVMe keeps the blocks a previous run left in NVMeDirs and adopts
	// them (see devmover.Config.KeepBlocks); otherwise they are freed.
	// Not with Shards yet: adopting a block needs every rank's part of it
	// in the same slot, which the stores do not record.
	KeepNVMe bool
	// WriteThrough: see kvtier.Config.WriteThrough.
	WriteThrough bool
	// MaxHoleBlocks: see kvtier.Config.MaxHoleBlocks (0: a lookup stops at
	// the first missing block).
	MaxHoleBlocks int
	// EventBuffer: see kvtier.Config.EventBuffer (0: no event stream).
	EventBuffer int
	// GatherStaging is the device memory (per GPU) of the copy engine's
	// gather/scatter path (transfer.MethodGather): split into
	// transfer.DefaultGatherBuffers buffers per direction. 0 means none.
	// The H200 measurements used 96 MiB (buffers of 16 MiB).
	GatherStaging int64
	// Policy makes tier t's eviction policy for its slot count. Nil means
	// policy.NewDenseLRU for every tier.
	Policy func(t kvtier.Tier, slots int) (policy.Policy[kvtier.BlockRef], error)
	// Tenants: see kvtier.Config.Tenants, with each Salt the tenant's as a
	// request gives it: Open folds it with Model, as Cache.Salt does. Their
	// policies come from Policy too.
	Tenants []kvtier.TenantLimit
	// Planner: see kvtier.Config.Planner (nil: kvtier.LoadAll).
	Planner kvtier.Planner
	// Codecs says how the host, NVMe and remote tiers hold blocks (zero:
	// as the GPU does). Example: Codecs{Host: codec.FP8E4M3PerHead, NVMe:
	// codec.FP8E4M3PerHead, KVHeads: 8} for llama-3.1-8b makes a host slot
	// of a 2 MiB block 1,052,672 bytes (1 MiB + 2 KiB of scales, rounded
	// to 4 KiB), so HostBytes holds twice the blocks, and the NVMe tier
	// likewise.
	Codecs Codecs
	// Logger receives what Open and Close do (sizes, recovered blocks,
	// failures on shutdown). Nil means slog.Default(). Nothing is logged on
	// a request's path.
	Logger *slog.Logger
}

// Shard is one GPU of a tensor-parallel cache: see Options.Shards.
type Shard struct {
	Device cudastream.Device
	GPU    transfer.GPULayout
}

func optionErr(field, format string, args ...any) error {
	return fmt.Errorf("%w: Options.%s: %s", kvtier.ErrConfig, field, fmt.Sprintf(format, args...))
}

// sizes are what Open derives from Options: every GPU's part of the cache.
type sizes struct {
	shards      []Shard
	blockBytes  int64       // one block's KV on one GPU
	storedBytes int64       // that block as the lower tiers hold it (Options.Codecs)
	shape       codec.Shape // the block's shape for the codec (with Codecs only)
	slotBytes   int64       // a host slot: a stored block rounded up to 4 KiB
	hostSlots   int64
	nvmeSlots   int64
}

// size checks o and derives the sizes of every part.
func (o *Options) size() (sizes, error) {
	var s sizes
	if err := o.check(); err != nil {
		return s, err
	}
	s.shards = o.Shards
	if len(s.shards) == 0 {
		s.shards = []Shard{{Device: o.Device, GPU: o.GPU}}
		if err := o.GPU.Validate(); err != nil {
			return s, optionErr("GPU", "%v", err)
		}
	}
	for r, sh := range s.shards {
		field := fmt.Sprintf("Shards[%d]", r)
		if sh.Device == nil {
			return s, optionErr(field+".Device", "is nil")
		}
		if err := sh.GPU.Validate(); err != nil {
			return s, optionErr(field+".GPU", "%v", err)
		}
		first := s.shards[0].GPU
		if r > 0 && (sh.GPU.NumBlocks != first.NumBlocks || sh.GPU.BlockBytes() != first.BlockBytes()) {
			return s, optionErr(field+".GPU", "%d blocks of %d bytes, but Shards[0] has %d of %d: every GPU holds its part of the same blocks",
				sh.GPU.NumBlocks, sh.GPU.BlockBytes(), first.NumBlocks, first.BlockBytes())
		}
	}
	s.blockBytes = s.shards[0].GPU.BlockBytes()
	s.storedBytes = s.blockBytes
	if o.Codecs.enabled() {
		var err error
		if s.shape, err = o.Codecs.shape(s.shards[0].GPU, o.BlockTokens); err != nil {
			return s, err
		}
		if s.storedBytes, err = codec.EncodedBytes(o.Codecs.Host, s.shape); err != nil {
			return s, optionErr("Codecs.Host", "%v", err)
		}
	}
	s.slotBytes = (s.storedBytes + 4095) &^ 4095
	if s.hostSlots = o.HostBytes / s.slotBytes; s.hostSlots == 0 {
		return s, optionErr("HostBytes", "%d holds no slot of %d bytes (a %d-byte block rounded up to 4 KiB)", o.HostBytes, s.slotBytes, s.storedBytes)
	}
	if s.nvmeSlots = o.NVMeBytes / s.storedBytes; o.NVMeBytes > 0 && s.nvmeSlots == 0 {
		return s, optionErr("NVMeBytes", "%d holds no block of %d bytes", o.NVMeBytes, s.storedBytes)
	}
	return s, nil
}

// check checks the fields of o that need no sizes.
func (o *Options) check() error {
	switch n := len(o.Shards); {
	case n > 0 && (o.Device != nil || o.GPU.NumBlocks != 0):
		return optionErr("Shards", "%d shards with Options.Device or Options.GPU set: give one or the other", n)
	case n > 0 && o.KeepNVMe:
		return optionErr("KeepNVMe", "with %d shards: adopting NVMe blocks is not supported for tensor parallelism yet", n)
	case n == 0 && o.Device == nil:
		return optionErr("Device", "is nil")
	case o.BlockTokens <= 0 || o.BlockTokens > kvtier.MaxBlockTokens:
		return optionErr("BlockTokens", "%d is not in [1, %d]", o.BlockTokens, kvtier.MaxBlockTokens)
	case o.HostBytes <= 0:
		return optionErr("HostBytes", "%d is not positive", o.HostBytes)
	case (len(o.NVMeDirs) == 0) != (o.NVMeBytes == 0):
		return optionErr("NVMeBytes", "%d with %d NVMeDirs: give both or neither", o.NVMeBytes, len(o.NVMeDirs))
	case o.NVMeBytes < 0:
		return optionErr("NVMeBytes", "%d is negative", o.NVMeBytes)
	case o.MaxHoleBlocks < 0:
		return optionErr("MaxHoleBlocks", "%d is negative", o.MaxHoleBlocks)
	case o.EventBuffer < 0:
		return optionErr("EventBuffer", "%d is negative", o.EventBuffer)
	case o.GatherStaging < 0:
		return optionErr("GatherStaging", "%d is negative", o.GatherStaging)
	case o.NVMeBytes == 0 && (o.NVMeAdmitter != nil || o.NVMeGate != nil):
		return optionErr("NVMeGate", "NVMeAdmitter or NVMeGate without an NVMe tier (NVMeBytes 0)")
	case o.NVMeBytes == 0 && o.NVMeReformat:
		return optionErr("NVMeReformat", "without an NVMe tier (NVMeBytes 0)")
	}
	if o.Remote != nil {
		if err := o.Remote.check(max(1, len(o.Shards))); err != nil {
			return err
		}
	}
	if err := o.Codecs.check(o); err != nil {
		return err
	}
	return o.Model.check()
}
