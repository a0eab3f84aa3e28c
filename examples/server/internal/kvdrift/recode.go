package kvdrift

import (
	"bytes"
	"fmt"
	"iter"
	"runtime"
	"sync"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/codec/cudacodec"
)

// ShapeOf is the codec's shape of c's KV blocks (package model's layout:
// per layer K then V, each tokens × KV heads × head dim).
func ShapeOf(c model.Config) codec.Shape {
	return codec.Shape{Layers: c.Layers, Parts: 2, Tokens: c.BlockTokens, Heads: c.KVHeads, HeadDim: c.HeadDim}
}

// HostRecoder is the round trip through codec.Encode and codec.Decode of
// blocks in host memory: a CPU backend's region (model.CPU.Slot).
type HostRecoder struct {
	shape codec.Shape
	codec codec.Codec
	slot  func(int32) []byte
	enc   []byte
}

// NewHostRecoder round-trips the blocks that slot returns through c.
func NewHostRecoder(cfg model.Config, c codec.Codec, slot func(int32) []byte) (*HostRecoder, error) {
	s := ShapeOf(cfg)
	n, err := codec.EncodedBytes(c, s)
	if err != nil {
		return nil, fmt.Errorf("kvdrift: %s blocks: %w", cfg.Name, err)
	}
	return &HostRecoder{shape: s, codec: c, slot: slot, enc: make([]byte, n)}, nil
}

// Recode implements Recoder.
func (h *HostRecoder) Recode(src, dst []int32) error {
	if len(src) != len(dst) {
		return fmt.Errorf("kvdrift: Recode: %d source slots, %d destinations", len(src), len(dst))
	}
	for i := range src {
		if err := roundTrip(h.codec, h.shape, h.slot(dst[i]), h.enc, h.slot(src[i])); err != nil {
			return fmt.Errorf("kvdrift: slot %d: %w", src[i], err)
		}
	}
	return nil
}

func roundTrip(c codec.Codec, s codec.Shape, dst, enc, src []byte) error {
	if err := codec.Encode(c, s, enc, src); err != nil {
		return err
	}
	return codec.Decode(c, s, dst, enc)
}

// DeviceRegion is the KV region in device memory: slot s is the
// BlockBytes bytes at Base + s*BlockBytes.
type DeviceRegion struct {
	Base       cudastream.DevicePtr
	BlockBytes int64
}

func (r DeviceRegion) slot(s int32) cudastream.DevicePtr {
	return r.Base + cudastream.DevicePtr(int64(s)*r.BlockBytes)
}

// CopyRecoder copies blocks in device memory as they are: no codec, the
// Recoder of a baseline (Setup.OneShotReference) that measures what reuse
// itself does to the logits.
type CopyRecoder struct {
	St     cudastream.Stream
	Region DeviceRegion
}

// Recode implements Recoder.
func (c CopyRecoder) Recode(src, dst []int32) error {
	if len(src) != len(dst) {
		return fmt.Errorf("kvdrift: Recode: %d source slots, %d destinations", len(src), len(dst))
	}
	for i := range src {
		if err := c.St.CopyDtoD(c.Region.slot(dst[i]), c.Region.slot(src[i]), c.Region.BlockBytes); err != nil {
			return fmt.Errorf("kvdrift: copying slot %d to %d: %w", src[i], dst[i], err)
		}
	}
	if err := c.St.Synchronize(); err != nil {
		return fmt.Errorf("kvdrift: copying %d blocks: %w", len(src), err)
	}
	return nil
}

// GoDeviceRecoder is the round trip through package codec in Go of blocks
// in device memory: a chunk of blocks is copied to the host, coded by as
// many goroutines as GOMAXPROCS, and copied back into the destinations.
// The fallback when the kernels cannot load.
type GoDeviceRecoder struct {
	st     cudastream.Stream
	region DeviceRegion
	shape  codec.Shape
	src    [][]byte // a chunk of blocks read
	dst    [][]byte // and their round trips
	enc    [][]byte // one per worker
}

// NewGoDeviceRecoder works on st (its device's memory) over region, a
// chunk of blocks at a time.
func NewGoDeviceRecoder(st cudastream.Stream, region DeviceRegion, cfg model.Config, chunk int) (*GoDeviceRecoder, error) {
	s := ShapeOf(cfg)
	n, err := codec.EncodedBytes(codec.FP8E4M3PerHead, s)
	if err != nil {
		return nil, fmt.Errorf("kvdrift: %s blocks: %w", cfg.Name, err)
	}
	if chunk < 1 || region.BlockBytes != s.BlockBytes() {
		return nil, fmt.Errorf("kvdrift: NewGoDeviceRecoder: chunk %d (want 1 or more), region blocks of %d bytes (the shape's: %d)", chunk, region.BlockBytes, s.BlockBytes())
	}
	g := &GoDeviceRecoder{st: st, region: region, shape: s}
	for range chunk {
		g.src = append(g.src, make([]byte, region.BlockBytes))
		g.dst = append(g.dst, make([]byte, region.BlockBytes))
	}
	for range runtime.GOMAXPROCS(0) {
		g.enc = append(g.enc, make([]byte, n))
	}
	return g, nil
}

// Recode implements Recoder.
func (g *GoDeviceRecoder) Recode(src, dst []int32) error {
	if len(src) != len(dst) {
		return fmt.Errorf("kvdrift: Recode: %d source slots, %d destinations", len(src), len(dst))
	}
	for i := 0; i < len(src); i += len(g.src) {
		n := min(len(g.src), len(src)-i)
		for j := range n {
			if err := g.st.CopyDtoH(g.src[j], g.region.slot(src[i+j])); err != nil {
				return fmt.Errorf("kvdrift: reading slot %d: %w", src[i+j], err)
			}
		}
		if err := g.st.Synchronize(); err != nil {
			return fmt.Errorf("kvdrift: reading %d blocks: %w", n, err)
		}
		if err := g.code(n); err != nil {
			return err
		}
		for j := range n {
			if err := g.st.CopyHtoD(g.region.slot(dst[i+j]), g.dst[j]); err != nil {
				return fmt.Errorf("kvdrift: writing slot %d: %w", dst[i+j], err)
			}
		}
		if err := g.st.Synchronize(); err != nil {
			return fmt.Errorf("kvdrift: writing %d blocks: %w", n, err)
		}
	}
	return nil
}

// code round-trips the first n blocks of the chunk, spread over the
// workers.
func (g *GoDeviceRecoder) code(n int) error {
	errs := make([]error, len(g.enc))
	var wg sync.WaitGroup
	for w := range g.enc {
		wg.Go(func() {
			for j := w; j < n && errs[w] == nil; j += len(g.enc) {
				errs[w] = roundTrip(codec.FP8E4M3PerHead, g.shape, g.dst[j], g.enc[w], g.src[j])
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("kvdrift: %w", err)
		}
	}
	return nil
}

// KernelRecoder is the round trip through package cudacodec's kernels, on
// the device: runs of adjacent slots are quantized into a scratch buffer
// and dequantized into their destinations, up to a chunk of blocks per
// launch. The caller MUST Close it before the device.
type KernelRecoder struct {
	dev      cudastream.Device
	k        *cudacodec.Kernels
	st       cudastream.Stream
	region   DeviceRegion
	shape    codec.Shape
	enc      cudastream.DevicePtr // chunk encoded blocks
	encBytes int64
	chunk    int
}

// NewKernelRecoder works on st with k over region; it allocates a scratch
// buffer of chunk encoded blocks on dev.
func NewKernelRecoder(dev cudastream.Device, k *cudacodec.Kernels, st cudastream.Stream, region DeviceRegion, cfg model.Config, chunk int) (*KernelRecoder, error) {
	s := ShapeOf(cfg)
	n, err := codec.EncodedBytes(codec.FP8E4M3PerHead, s)
	if err != nil {
		return nil, fmt.Errorf("kvdrift: %s blocks: %w", cfg.Name, err)
	}
	if chunk < 1 || chunk > cudacodec.MaxBlocks || region.BlockBytes != s.BlockBytes() {
		return nil, fmt.Errorf("kvdrift: NewKernelRecoder: chunk %d (want 1 to %d), region blocks of %d bytes (the shape's: %d)", chunk, cudacodec.MaxBlocks, region.BlockBytes, s.BlockBytes())
	}
	enc, err := dev.Alloc(int64(chunk) * n)
	if err != nil {
		return nil, fmt.Errorf("kvdrift: scratch of %d encoded blocks: %w", chunk, err)
	}
	return &KernelRecoder{dev: dev, k: k, st: st, region: region, shape: s, enc: enc, encBytes: n, chunk: chunk}, nil
}

// Close frees the scratch buffer.
func (r *KernelRecoder) Close() error { return r.dev.Free(r.enc) }

// Recode implements Recoder.
func (r *KernelRecoder) Recode(src, dst []int32) error {
	if len(src) != len(dst) {
		return fmt.Errorf("kvdrift: Recode: %d source slots, %d destinations", len(src), len(dst))
	}
	for i, j := range adjacentRuns(src, dst, r.chunk) {
		if err := r.k.Quantize(r.st, r.shape, r.enc, r.region.slot(src[i]), j-i); err != nil {
			return fmt.Errorf("kvdrift: slots %d..%d: %w", src[i], src[j-1], err)
		}
		if err := r.k.Dequantize(r.st, r.shape, r.region.slot(dst[i]), r.enc, j-i); err != nil {
			return fmt.Errorf("kvdrift: into slots %d..%d: %w", dst[i], dst[j-1], err)
		}
	}
	if err := r.st.Synchronize(); err != nil {
		return fmt.Errorf("kvdrift: round trip of %d blocks: %w", len(src), err)
	}
	return nil
}

// adjacentRuns yields the runs [i, j) of at most chunk blocks that are
// adjacent slots in src and in dst, in order, covering every index once.
func adjacentRuns(src, dst []int32, chunk int) iter.Seq2[int, int] {
	return func(yield func(int, int) bool) {
		for i := 0; i < len(src); {
			j := i + 1
			for j < len(src) && j-i < chunk && src[j] == src[j-1]+1 && dst[j] == dst[j-1]+1 {
				j++
			}
			if !yield(i, j) {
				return
			}
			i = j
		}
	}
}

// Check reads the blocks in slots src and dst and reports an error unless
// dst holds exactly the Go reference's round trip of src: the kernels'
// bit-for-bit promise, checked on the blocks an experiment used.
func (r *KernelRecoder) Check(src, dst int32) error {
	a, b := make([]byte, r.region.BlockBytes), make([]byte, r.region.BlockBytes)
	if err := r.st.CopyDtoH(a, r.region.slot(src)); err != nil {
		return fmt.Errorf("kvdrift: reading slot %d: %w", src, err)
	}
	if err := r.st.CopyDtoH(b, r.region.slot(dst)); err != nil {
		return fmt.Errorf("kvdrift: reading slot %d: %w", dst, err)
	}
	if err := r.st.Synchronize(); err != nil {
		return fmt.Errorf("kvdrift: reading slots %d and %d: %w", src, dst, err)
	}
	want := make([]byte, len(a))
	if err := roundTrip(codec.FP8E4M3PerHead, r.shape, want, make([]byte, r.encBytes), a); err != nil {
		return fmt.Errorf("kvdrift: slot %d: %w", src, err)
	}
	if !bytes.Equal(b, want) {
		i := 0
		for b[i] == want[i] {
			i++
		}
		return fmt.Errorf("kvdrift: the kernels' round trip of slot %d (in slot %d) differs from the Go reference's at byte %d of %d", src, dst, i, len(b))
	}
	return nil
}
