package transfer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/codec/cudacodec"
)

// The codec path (Config.Codec) keeps the host pool's slots and the
// staging buffers encoded, and codes blocks on the device, chunk by chunk
// (CodecChunkBlocks blocks), through a ring of device scratch buffers per
// direction, each a chunk of encoded blocks:
//
//	offload: quantize (reading the GPU blocks where they lie) -> scratch -> DMA to the host slots
//	onboard: DMA from the host slots -> scratch -> dequantize (writing the GPU blocks where they lie)
//
// The kernels read and write the KV cache through its layout (a table of
// its parts' addresses in device memory, written by New), so no copy
// gathers or scatters blocks around them: against the gather path that
// copied them, an op of 64 blocks issued in 138-220 us instead of 245-359
// and kept 0.91-0.97 of the link's rate one way instead of 0.89-0.93
// (benchmarks/results/fp8-codec-path-fused-h200.md). The kernels run on a second stream per
// direction, the DMAs on the direction's own, so that one chunk is coded
// while the link moves the one before it. As on the gather path, a
// chunk's DMA waits for the event of the kernel that filled its buffer
// (or the kernel for the DMA's), and a buffer is refilled only after the
// event of the step that last read it: nothing waits on the host, and no
// scratch is overwritten while a copy or kernel still reads it (invariant
// 3). The scratch and the table are allocated by New (invariant 5).
//
// The kernels are package cudacodec's, loaded by New; on a device that
// cannot load them and whose streams run Go kernels (the simulator,
// cudastream.GoLauncher) the same steps run package codec's Go reference,
// priced on the simulator's clock by Config.GoCodecEncodeBytesPerS and
// GoCodecDecodeBytesPerS.
//
// An offload codes whole blocks. An onboard moves its blocks whole, or,
// with Config.CodecLayerGroups above 1, once per group of layers: for
// each group, every chunk
// copies its blocks' scales and that group's codes, and the dequantize
// writes that group's layers; the group's layer events are recorded after
// its last chunk, so a pass starts on the first layers while the link
// carries the rest. Each group after the first copies the scales again
// (ScaleBytes a block: 2 KiB of 1 MiB for llama-3.1-8b).
//
// With Config.OnCodecKernel, the first launch of each coded transfer is
// timed between timing events on the kernels' stream, while one of a few
// pairs per direction is free, and reported once the transfer is done
// (codectime.go): the server's calibration learns the kernels' rates from
// them as it learns the links'.

// Defaults of the codec path's ring: chunks of 8 blocks kept 0.96-0.97 of
// the link's rate on the H200 (benchmarks/results/fp8-codec-h200.md).
const (
	DefaultCodecChunkBlocks = 8
	DefaultCodecBuffers     = 2
	// DefaultCodecLayerGroups is how many groups of layers an onboard
	// dequantizes one after another: 1, whole blocks. In 4 groups, served
	// on the H200, a group's steps cost the caller 4x the issue time (700
	// us for 64 blocks, against 200) and the learned host link fell from
	// 50 to 34-40 GB/s; agentic TTFT p50 rose from 33.5 to 43.0 ms
	// (benchmarks/results/serve-codec-h200-groups). Groups pay once a
	// group's chunks issue as cheaply as a whole block's.
	DefaultCodecLayerGroups = 1
)

// blockKernels code blocks of one shape on a stream, between the GPU
// blocks named by ids, where the engine's GPU layout keeps them, and
// len(ids) encoded blocks one after another at enc: quantize whole
// blocks, dequantize the layers in r (reading those layers' codes and
// the blocks' scales only).
type blockKernels interface {
	quantize(st cudastream.Stream, enc uint64, ids []int32) error
	dequantize(st cudastream.Stream, enc uint64, ids []int32, r cudacodec.Layers) error
	close() error
	name() string
}

// codecState is the engine's codec: its format and its kernels.
type codecState struct {
	c        codec.Codec
	shape    codec.Shape
	raw, enc int64              // one block's bytes as bf16 and encoded
	chunk    int                // blocks per chunk
	groups   []cudacodec.Layers // an onboard's groups of layers, in order
	kern     blockKernels
}

// layerGroups splits layers into n groups as even as can be, in order.
func layerGroups(layers, n int) []cudacodec.Layers {
	g := make([]cudacodec.Layers, 0, n)
	for i := range n {
		first, next := i*layers/n, (i+1)*layers/n
		g = append(g, cudacodec.Layers{First: first, Count: next - first})
	}
	return g
}

// codecRing is one direction's device scratch ring. It belongs to its
// direction and is used only under the direction's lock.
type codecRing struct {
	kernel cudastream.Stream // the kernels
	mem    cudastream.DevicePtr
	bufs   []codecBuf
	next   int
	join   cudastream.Event
	// ids and link are a chunk's GPU blocks and link copies (scratch).
	ids  []int32
	link []cudastream.Copy
	// timers time a launch of each coded transfer, with
	// Config.OnCodecKernel (codectime.go); free holds those not in use,
	// nil without it.
	timers []*kernelTimer
	free   chan *kernelTimer
}

type codecBuf struct {
	enc    uint64           // the chunk, encoded
	filled cudastream.Event // recorded after the step that wrote the buffer
	freed  cudastream.Event // recorded after the step that read it
	used   bool
}

// checkCodecConfig checks the codec's settings, naming the field, and
// fills their defaults. It returns the size of a block in the host pool.
func checkCodecConfig(cfg *Config) (int64, error) {
	if cfg.Codec == codec.None {
		return cfg.GPU.BlockBytes(), nil
	}
	if err := cfg.Codec.Check(); err != nil {
		return 0, fmt.Errorf("transfer: Config.Codec: %w", err)
	}
	if err := cfg.GPU.Validate(); err != nil {
		return 0, err
	}
	s, g := cfg.CodecShape, &cfg.GPU
	if err := s.Validate(); err != nil {
		return 0, fmt.Errorf("transfer: Config.CodecShape: %w", err)
	}
	switch {
	case s.Layers != g.Layers || s.Parts != g.Parts:
		return 0, fmt.Errorf("transfer: Config.CodecShape has %d layers of %d parts, but Config.GPU has %d of %d", s.Layers, s.Parts, g.Layers, g.Parts)
	case 2*int64(s.Tokens)*int64(s.Heads)*int64(s.HeadDim) != g.PartBytes:
		return 0, fmt.Errorf("transfer: Config.CodecShape: %d tokens x %d heads x %d values as bf16 are %d bytes, but Config.GPU.PartBytes is %d",
			s.Tokens, s.Heads, s.HeadDim, 2*int64(s.Tokens)*int64(s.Heads)*int64(s.HeadDim), g.PartBytes)
	case cfg.CodecChunkBlocks < 0 || cfg.CodecChunkBlocks > cudacodec.MaxBlocks:
		return 0, fmt.Errorf("transfer: Config.CodecChunkBlocks must be in [0, %d] (0: %d), got %d", cudacodec.MaxBlocks, DefaultCodecChunkBlocks, cfg.CodecChunkBlocks)
	case cfg.CodecBuffers < 0 || cfg.CodecBuffers > 64:
		return 0, fmt.Errorf("transfer: Config.CodecBuffers must be in [0, 64] (0: %d), got %d", DefaultCodecBuffers, cfg.CodecBuffers)
	case cfg.CodecLayerGroups < 0 || cfg.CodecLayerGroups > s.Layers:
		return 0, fmt.Errorf("transfer: Config.CodecLayerGroups must be in [0, %d] (the block's layers; 0: %d), got %d", s.Layers, DefaultCodecLayerGroups, cfg.CodecLayerGroups)
	case !(cfg.GoCodecEncodeBytesPerS >= 0) || math.IsInf(cfg.GoCodecEncodeBytesPerS, 0):
		return 0, fmt.Errorf("transfer: Config.GoCodecEncodeBytesPerS must be finite and not negative, got %g", cfg.GoCodecEncodeBytesPerS)
	case !(cfg.GoCodecDecodeBytesPerS >= 0) || math.IsInf(cfg.GoCodecDecodeBytesPerS, 0):
		return 0, fmt.Errorf("transfer: Config.GoCodecDecodeBytesPerS must be finite and not negative, got %g", cfg.GoCodecDecodeBytesPerS)
	case cfg.Sums:
		return 0, errors.New("transfer: Config.Sums with Config.Codec: the sums are of the GPU's bytes, the host holds encoded ones")
	case cfg.Method == MethodGather:
		return 0, errors.New("transfer: Config.Method gather with Config.Codec: the codec path moves blocks through its own device scratch")
	}
	if cfg.CodecChunkBlocks == 0 {
		cfg.CodecChunkBlocks = DefaultCodecChunkBlocks
	}
	if cfg.CodecBuffers == 0 {
		cfg.CodecBuffers = DefaultCodecBuffers
	}
	if cfg.CodecLayerGroups == 0 {
		cfg.CodecLayerGroups = min(DefaultCodecLayerGroups, s.Layers)
	}
	enc, err := codec.EncodedBytes(cfg.Codec, s)
	if err != nil {
		return 0, fmt.Errorf("transfer: Config.CodecShape: %w", err)
	}
	return enc, nil
}

// setupCodec loads the codec's kernels (or picks the Go ones) and builds
// each direction's ring. Called by New once the streams exist; on error,
// Close releases what was built.
func (e *Engine) setupCodec(cfg *Config) error {
	if cfg.Codec == codec.None {
		return nil
	}
	cs := &codecState{c: cfg.Codec, shape: cfg.CodecShape, raw: cfg.CodecShape.BlockBytes(), chunk: cfg.CodecChunkBlocks,
		groups: layerGroups(cfg.CodecShape.Layers, cfg.CodecLayerGroups)}
	cs.enc, _ = codec.EncodedBytes(cfg.Codec, cfg.CodecShape) // checked by checkCodecConfig
	prio := [2]int{cfg.OnboardPriority, cfg.OffloadPriority}
	for i, d := range []*direction{&e.on, &e.off} {
		r, err := newCodecRing(e.dev, cs, cfg.CodecBuffers, prio[i])
		if r != nil {
			d.cring = r
		}
		if err == nil && cfg.OnCodecKernel != nil {
			err = r.newKernelTimers(e.dev)
		}
		if err != nil {
			e.codec = cs // so that Close releases the kernels, if loaded
			return err
		}
		if cs.kern == nil {
			k, err := loadBlockKernels(e.dev, r.kernel, cfg)
			if err != nil {
				return err
			}
			cs.kern = k
		}
	}
	e.codec = cs
	return nil
}

// loadBlockKernels loads cudacodec's kernels on dev and writes the GPU
// layout's table for them (on st), or, where dev cannot run them and st
// runs Go kernels, returns the Go reference's.
func loadBlockKernels(dev cudastream.Device, st cudastream.Stream, cfg *Config) (blockKernels, error) {
	k, err := cudacodec.Load(dev)
	if err == nil {
		g := &gpuKernels{k: k, dev: dev, shape: cfg.CodecShape}
		if err := g.writeTable(st, &cfg.GPU); err != nil {
			return nil, errors.Join(err, g.close())
		}
		return g, nil
	}
	if _, ok := st.(cudastream.GoLauncher); ok && errors.Is(err, cudastream.ErrNotSupported) {
		g := &goKernels{c: cfg.Codec, shape: cfg.CodecShape, gpu: cfg.GPU, raw: cfg.CodecShape.BlockBytes(),
			encRate: cfg.GoCodecEncodeBytesPerS, decRate: cfg.GoCodecDecodeBytesPerS}
		g.enc, _ = codec.EncodedBytes(cfg.Codec, cfg.CodecShape)
		return g, nil
	}
	return nil, fmt.Errorf("transfer: Config.Codec %s: the device runs neither the codec's kernels nor Go kernels: %w", cfg.Codec, err)
}

// newCodecRing allocates n scratch buffers of a chunk each, their events
// and the ring's stream. On error it returns what it built, for Close.
func newCodecRing(dev cudastream.Device, cs *codecState, n, prio int) (*codecRing, error) {
	s, err := dev.NewStream(prio)
	if err != nil {
		return nil, fmt.Errorf("transfer: codec stream: %w", err)
	}
	r := &codecRing{kernel: s}
	bufBytes := roundUp(int64(cs.chunk)*cs.enc, 256)
	if r.mem, err = dev.Alloc(int64(n) * bufBytes); err != nil {
		return r, fmt.Errorf("transfer: %d codec scratch buffers of %d bytes (Config.CodecBuffers, Config.CodecChunkBlocks): %w", n, bufBytes, err)
	}
	if r.join, err = dev.NewEvent(cudastream.EventOptions{}); err != nil {
		return r, fmt.Errorf("transfer: codec event: %w", err)
	}
	for i := range n {
		b := codecBuf{enc: uint64(r.mem) + uint64(int64(i)*bufBytes)}
		if b.filled, err = dev.NewEvent(cudastream.EventOptions{}); err != nil {
			return r, fmt.Errorf("transfer: codec event: %w", err)
		}
		if b.freed, err = dev.NewEvent(cudastream.EventOptions{}); err != nil {
			b.filled.Destroy()
			return r, fmt.Errorf("transfer: codec event: %w", err)
		}
		r.bufs = append(r.bufs, b)
	}
	r.ids = make([]int32, 0, cs.chunk)
	r.link = make([]cudastream.Copy, 0, cs.chunk)
	return r, nil
}

// destroy releases the ring's stream, events and memory, after the
// stream's work completes.
func (r *codecRing) destroy(dev cudastream.Device) error {
	err := destroyRing(dev, r.kernel, r.join, r.mem, len(r.bufs), func(i int) (cudastream.Event, cudastream.Event) {
		return r.bufs[i].filled, r.bufs[i].freed
	})
	return errors.Join(append(r.destroyTimers(), err)...)
}

// CodecBytes is the device memory the engine's codec scratch takes (0
// without Config.Codec).
func (e *Engine) CodecBytes() int64 {
	var n int64
	if e.codec == nil {
		return 0
	}
	for _, d := range []*direction{&e.on, &e.off} {
		if r := d.cring; r != nil && len(r.bufs) > 0 {
			n += int64(len(r.bufs)) * roundUp(int64(e.codec.chunk)*e.codec.enc, 256)
		}
	}
	return n
}

// CodecKernels names what codes blocks: "cuda" (package cudacodec's
// kernels), "go" (package codec on a simulated device), or "" without
// Config.Codec.
func (e *Engine) CodecKernels() string {
	if e.codec == nil || e.codec.kern == nil {
		return ""
	}
	return e.codec.kern.name()
}

func roundUp(n, m int64) int64 { return (n + m - 1) / m * m }

// gpuKernels are cudacodec's kernels, with the GPU layout's table.
type gpuKernels struct {
	k      *cudacodec.Kernels
	dev    cudastream.Device
	shape  codec.Shape
	layout cudacodec.Layout // Table 0 until writeTable
}

// writeTable allocates the layout's table (its parts' base addresses) in
// device memory and copies it there on st, waiting for the copy.
func (g *gpuKernels) writeTable(st cudastream.Stream, l *GPULayout) error {
	table := make([]byte, 8*len(l.Base))
	for i, p := range l.Base {
		binary.LittleEndian.PutUint64(table[8*i:], uint64(p))
	}
	p, err := g.dev.Alloc(int64(len(table)))
	if err != nil {
		return fmt.Errorf("transfer: the codec's layout table (%d bytes): %w", len(table), err)
	}
	g.layout = cudacodec.Layout{Table: p, Stride: l.BlockStride}
	if err := st.CopyHtoD(p, table); err != nil {
		return fmt.Errorf("transfer: the codec's layout table: %w", err)
	}
	if err := st.Synchronize(); err != nil {
		return fmt.Errorf("transfer: the codec's layout table: %w", err)
	}
	return nil
}

func (g *gpuKernels) quantize(st cudastream.Stream, enc uint64, ids []int32) error {
	return g.k.QuantizeBlocks(st, g.shape, cudastream.DevicePtr(enc), g.layout, ids)
}

func (g *gpuKernels) dequantize(st cudastream.Stream, enc uint64, ids []int32, r cudacodec.Layers) error {
	return g.k.DequantizeBlocks(st, g.shape, g.layout, cudastream.DevicePtr(enc), ids, r)
}

func (g *gpuKernels) close() error {
	var err error
	if g.layout.Table != 0 {
		err = g.dev.Free(g.layout.Table)
	}
	return errors.Join(err, g.k.Close())
}

func (g *gpuKernels) name() string { return "cuda" }

// goKernels run package codec's Go reference as Go kernels of a simulated
// device, priced at encRate and decRate bf16 bytes a second.
type goKernels struct {
	c                codec.Codec
	shape            codec.Shape
	gpu              GPULayout
	raw, enc         int64
	encRate, decRate float64
}

func (g *goKernels) quantize(st cudastream.Stream, enc uint64, ids []int32) error {
	return g.launch("kvtier_fp8_quantize_blocks", st, enc, ids, cudacodec.Layers{First: 0, Count: g.gpu.Layers}, true)
}

func (g *goKernels) dequantize(st cudastream.Stream, enc uint64, ids []int32, r cudacodec.Layers) error {
	return g.launch("kvtier_fp8_dequantize_blocks", st, enc, ids, r, false)
}

func (g *goKernels) close() error { return nil }
func (g *goKernels) name() string { return "go" }

// launch codes len(ids) blocks as one Go kernel, the layers in r (all of
// them when quantizing): its ranges are the encoded blocks, then each
// block's parts of those layers in (layer, part) order. A dequantize
// decodes whole blocks from the encoded ones (where codes of other layers
// may be stale: any byte is a code) and writes r's parts only.
func (g *goKernels) launch(name string, st cudastream.Stream, enc uint64, ids []int32, r cudacodec.Layers, quantize bool) error {
	ids = slices.Clone(ids) // the caller's are scratch; Run comes later
	n, parts := int64(len(ids)), g.gpu.Parts
	first, lps := r.First*parts, r.Count*parts
	k := cudastream.GoKernel{Name: name, Ranges: make([]cudastream.DeviceRange, 0, 1+len(ids)*lps)}
	k.Ranges = append(k.Ranges, cudastream.DeviceRange{Ptr: cudastream.DevicePtr(enc), Bytes: n * g.enc})
	for _, id := range ids {
		for lp := first; lp < first+lps; lp++ {
			k.Ranges = append(k.Ranges, cudastream.DeviceRange{Ptr: cudastream.DevicePtr(g.gpu.addr(id, lp/parts, lp%parts)), Bytes: g.gpu.PartBytes})
		}
	}
	rate := g.decRate
	if quantize {
		rate = g.encRate
	}
	if rate > 0 {
		k.Cost = time.Duration(math.Round(float64(n*g.raw) * float64(r.Count) / float64(g.gpu.Layers) / rate * 1e9))
	}
	k.Run = func(mem [][]byte) error {
		coded, raw := mem[0], make([]byte, g.raw)
		for b := range n {
			out := coded[b*g.enc : (b+1)*g.enc]
			var err error
			if quantize {
				for i, part := range mem[1+int(b)*lps : 1+int(b+1)*lps] {
					copy(raw[int64(first+i)*g.gpu.PartBytes:], part)
				}
				err = codec.Encode(g.c, g.shape, out, raw)
			} else if err = codec.Decode(g.c, g.shape, raw, out); err == nil {
				for i, part := range mem[1+int(b)*lps : 1+int(b+1)*lps] {
					copy(part, raw[int64(first+i)*g.gpu.PartBytes:])
				}
			}
			if err != nil {
				return fmt.Errorf("block %d of %d (GPU block %d): %w", b, n, ids[b], err)
			}
		}
		return nil
	}
	gl, ok := st.(cudastream.GoLauncher)
	if !ok {
		return fmt.Errorf("transfer: %s: the stream (%T) runs no Go kernels: %w", name, st, cudastream.ErrNotSupported)
	}
	return gl.LaunchGo(k)
}
