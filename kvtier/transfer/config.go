package transfer

import (
	"errors"
	"fmt"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/codec"
)

// Config configures an Engine.
type Config struct {
	// GPU is where the server keeps KV blocks.
	GPU GPULayout
	// Host is the pinned host pool. Its SlotBytes must hold a whole block.
	Host HostLayout
	// Staging holds the pinned buffers for NVMe (or pageable) onboards, each
	// a whole number of slots of Host.SlotBytes (at least one). Two or more
	// make a ring: the engine reads into buffer k while buffer k-1 is being
	// copied to the device. They come from kvtier/pinned and MUST be
	// registered with the device. Optional.
	Staging [][]byte
	// MaxBatch caps the descriptors per batched copy call or copy-kernel
	// call (default 4096).
	MaxBatch int
	// Method is how descriptors are submitted (default MethodAuto: the
	// copy kernel for small pieces, batches for large ones, with a higher
	// switch for onboards while offloads are in flight).
	Method Method
	// KernelBelowBytes is MethodAuto's switch: a call whose descriptors
	// average fewer bytes goes to the copy kernel. Default
	// DefaultKernelBelowBytes (64 KiB): 16 KiB blocks scattered on the GPU
	// go to the kernel, 64 KiB blocks and up to cuMemcpyBatchAsync.
	KernelBelowBytes int64
	// OnboardContendedKernelBelowBytes replaces KernelBelowBytes for
	// onboards while offloads are in flight (docs/transfer.md has the
	// measurements). Default DefaultOnboardContendedKernelBelowBytes (256
	// KiB), or KernelBelowBytes where only that is set: while offloads run,
	// an onboard of 64 KiB blocks goes to the kernel and one of 256 KiB
	// blocks to batches.
	OnboardContendedKernelBelowBytes int64
	// KernelCopy tunes the copy kernel (CTAs bound the SMs it takes from
	// the server's compute). Zero fields take cudastream's defaults.
	KernelCopy cudastream.KernelCopyOptions
	// OnboardPriority and OffloadPriority are stream priorities; lower runs
	// first (CUDA's convention). Defaults: -1 and 0.
	OnboardPriority, OffloadPriority int
	// GatherBuffers and GatherBufferBytes give each direction a ring of
	// device staging buffers for the gather/scatter path (MethodGather, and
	// MethodAuto's choice of it; see gather.go): GatherBuffers buffers of
	// GatherBufferBytes (default DefaultGatherBufferBytes) per direction,
	// and a second stream per direction for the gather and scatter
	// kernels. Zero GatherBuffers means no ring: Auto never gathers and
	// MethodGather is refused. DefaultGatherBuffers of the default size
	// take 96 MiB of device memory for both directions.
	GatherBuffers     int
	GatherBufferBytes int64
	// GatherMinRunBytes and GatherBelowBytes are MethodAuto's switches to
	// the gather path: a transfer gathers when its GPU side's pieces
	// average fewer than GatherBelowBytes and its host side coalesces into
	// runs averaging at least GatherMinRunBytes and at least four times
	// those pieces (defaults DefaultGatherMinRunBytes and
	// DefaultGatherBelowBytes; kvtier probe --methods measures both).
	GatherMinRunBytes, GatherBelowBytes int64
	// Sums makes every offload and staged onboard also compute, on the
	// GPU, the word sum (internal/checksum's WordSum) of each block it
	// moved, over the block's bytes in host order: Transfer.Sums
	// (sums.go). Onboards from the pool are not summed: their bytes came
	// from an offload, or were checked on their way into the pool. The device
	// MUST implement cudastream.WordSummer (a TimingOnly simulator does
	// not) and GPU.PartBytes be a multiple of 8; New fails otherwise,
	// wrapping cudastream.ErrNotSupported where the device is the cause.
	Sums bool
	// Now is the clock used for Transfer.Duration (default: wall time since
	// the engine started). Replays pass the simulator's virtual clock.
	Now func() time.Duration
	// Polled makes the engine run no goroutine of its own: a transfer is
	// done when a call to Engine.Poll finds its events complete, and its
	// OnDone functions run inside that Poll. The gather path is submitted
	// on the caller's goroutine. A discrete-event replay uses it on the
	// simulator's virtual clock, so that completions happen at modelled
	// times in a deterministic order, and nothing waits on the host. Sums
	// and staged onboards (OnboardStaged) wait on the host and are
	// refused.
	Polled bool
	// Codec is how the host pool's slots and the staging buffers hold
	// blocks: codec.None (the GPU's bytes) or codec.FP8E4M3PerHead, about
	// half of them. An offload then quantizes blocks on the device and
	// copies the encoded bytes out; an onboard copies them in and
	// dequantizes (codec.go). Host.SlotBytes need only hold
	// codec.EncodedBytes(Codec, CodecShape). Not with Sums or
	// MethodGather; the gather path's ring (GatherBuffers) is not built.
	Codec codec.Codec
	// CodecShape is a block's shape for the codec: GPU's Layers and
	// Parts, and Tokens × Heads × HeadDim bf16 values per part (2 bytes
	// each: GPU.PartBytes). For llama-3.1-8b with 16-token blocks,
	// {32, 2, 16, 8, 128}. Required with a Codec.
	CodecShape codec.Shape
	// CodecChunkBlocks is how many blocks the codec's kernels code
	// while the link moves another chunk (default DefaultCodecChunkBlocks);
	// CodecBuffers is how many such chunks each direction's device
	// scratch ring holds (default DefaultCodecBuffers). The scratch takes
	// CodecBuffers × CodecChunkBlocks encoded blocks of device memory per
	// direction: 16 MiB for 2 MiB blocks by default.
	CodecChunkBlocks, CodecBuffers int
	// CodecLayerGroups is how many groups of layers an onboard dequantizes
	// one after another (default DefaultCodecLayerGroups, 1; at most the
	// block's layers): each group's layer events are recorded once every
	// block's layers of that group are on the GPU, so a pass computes the
	// first layers while the link carries the last. 1 codes whole blocks,
	// every layer ready at the end.
	CodecLayerGroups int
	// GoCodecEncodeBytesPerS and GoCodecDecodeBytesPerS price the Go
	// codec on a simulated device (which cannot run the kernels): a
	// chunk's coding takes its bf16 bytes at this rate on the device's
	// clock, plus a kernel launch. Pass the cost model's figures
	// (cost.Codec's EncodeBytesPerS and DecodeBytesPerS, 1.18e12 and
	// 1.12e12 for fp8-e4m3 on the H200); 0 prices the launch alone.
	GoCodecEncodeBytesPerS, GoCodecDecodeBytesPerS float64
	// OnCodecKernel, with a Codec, is told of one launch of the codec's
	// kernels in each coded transfer, timed on the device between events
	// recorded around it (codectime.go): what a calibration learns the
	// kernels' rates from (cost.Calibration.AddCodecKernel). It runs where
	// the transfer completes (a completer goroutine, or the Poll that
	// completes it) and MUST NOT block. Nil: no launch is timed.
	OnCodecKernel func(CodecKernel)
}

// validate checks cfg, naming the field at fault, and fills in its
// defaults. It returns MethodAuto's table, made from cfg's switches.
func (cfg *Config) validate() (autoTable, error) {
	hostBlock, err := checkCodecConfig(cfg)
	if err != nil {
		return autoTable{}, err
	}
	if err := cfg.checkMemory(hostBlock); err != nil {
		return autoTable{}, err
	}
	if cfg.MaxBatch < 0 {
		return autoTable{}, fmt.Errorf("transfer: Config.MaxBatch must not be negative, got %d", cfg.MaxBatch)
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = 4096
	}
	if cfg.Method >= NumMethods {
		return autoTable{}, fmt.Errorf("transfer: Config.Method %d is not a method (auto, batch, kernel, loop or gather)", cfg.Method)
	}
	if err := checkGatherConfig(cfg); err != nil {
		return autoTable{}, err
	}
	auto, err := newAutoTable(cfg)
	if err != nil {
		return autoTable{}, err
	}
	if cfg.Polled && cfg.Sums {
		return autoTable{}, errors.New("transfer: Config.Polled and Config.Sums: a polled engine cannot wait on the host for the sums")
	}
	if cfg.OnboardPriority == 0 && cfg.OffloadPriority == 0 {
		cfg.OnboardPriority = -1
	}
	return auto, nil
}

// checkMemory checks the memory the engine copies between: the GPU
// layout, the host pool's slots (each holding hostBlock bytes) and
// registrations, and the staging buffers.
func (cfg *Config) checkMemory(hostBlock int64) error {
	if err := cfg.GPU.Validate(); err != nil {
		return err
	}
	h := &cfg.Host
	if h.SlotBytes < hostBlock {
		return fmt.Errorf("transfer: Config.Host.SlotBytes %d cannot hold a block of %d bytes (codec %s)", h.SlotBytes, hostBlock, cfg.Codec)
	}
	if r := h.RegistrationBytes; r < 0 || (r > 0 && r < int64(len(h.Pool)) && r%h.SlotBytes != 0) {
		return fmt.Errorf("transfer: Config.Host.RegistrationBytes %d is not a multiple of SlotBytes %d: a slot would straddle two registrations", r, h.SlotBytes)
	}
	if o := h.RegistrationOffset; o < 0 || o%h.SlotBytes != 0 || (o > 0 && o >= h.RegistrationBytes) {
		return fmt.Errorf("transfer: Config.Host.RegistrationOffset %d is not a multiple of SlotBytes %d below RegistrationBytes %d: a slot would straddle two registrations", o, h.SlotBytes, h.RegistrationBytes)
	}
	if h.Slots() == 0 {
		return fmt.Errorf("transfer: Config.Host.Pool (%d bytes) holds no slot of %d bytes", len(h.Pool), h.SlotBytes)
	}
	for i, b := range cfg.Staging {
		if int64(len(b)) < h.SlotBytes {
			return fmt.Errorf("transfer: Config.Staging[%d] (%d bytes) holds no slot of %d bytes", i, len(b), h.SlotBytes)
		}
	}
	return nil
}
