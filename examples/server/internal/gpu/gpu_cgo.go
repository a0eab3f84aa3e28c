//go:build cgo

package gpu

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "gm_driver.h"
*/
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/model"
)

// cuBLAS's enums (cublas_api.h, library_types.h).
const (
	opN     = 0
	opT     = 1
	typeF32 = 0  // CUDA_R_32F
	typeBF  = 14 // CUDA_R_16BF
)

type kernel int

const (
	kInit kernel = iota
	kEmbed
	kRMSNorm
	kRope
	kGather
	kSoftmax
	kSiLU
	kArgmax
	kFlash64
	kFlash128
	numKernels
)

var kernelNames = [numKernels]string{"kvm_init_weights", "kvm_embed", "kvm_rmsnorm", "kvm_rope_store", "kvm_gather",
	"kvm_softmax", "kvm_silu_mul", "kvm_argmax", "kvm_flash_d64", "kvm_flash_d128"}

// The Hopper kernels (kernels/hopper.ptx), loaded on a 9.x device.
const (
	hFlash = iota
	hGatherT
	numHopper
)

var hopperNames = [numHopper]string{"kvm_flash_h128", "kvm_gather_t"}

// hopperFlashShared is kvm_flash_h128's dynamic shared memory
// (HOPPER_FLASH_SMEM): Q and two stages of a K and a Vᵀ tile, 32 KiB each,
// and 1 KiB to align them for the swizzle.
const hopperFlashShared = 5*32768 + 1024

type ptr = C.gmPtr

// Model is the model on GPU 0. It is not safe for concurrent use. The
// caller MUST Close it.
type Model struct {
	cfg model.Config
	o   Options
	lib *C.gmLib
	fn  [numKernels]C.gmFunc
	fnH [numHopper]C.gmFunc
	// hopper: fused passes run kvm_gather_t and kvm_flash_h128, which
	// reads V transposed from the vc scratch.
	hopper    bool
	hopperErr error  // why AttentionAuto did not load the Hopper kernels
	cc        [2]int // compute capability
	args      [16]uint64
	gemm      C.gmGemm

	region   ptr
	numSlots int
	chunk    int // queries per attention chunk

	allocs []ptr
	// Weights.
	embed, final, lmHead ptr
	layers               [][model.NumLayerTensors]ptr
	cos, sin             ptr
	// Scratch.
	x, xn, qkv, q, att, gu, act ptr
	kc, vc, s, p                ptr
	logits, next                ptr
	tok, pos, slots             ptr

	hostTok []int32
	// Options.StageTimes: the stage each recorded event starts, and the
	// seconds per stage since Stages last reported them.
	marks   []string
	stages  []StageTime
	events  []cudastream.Event // Plan.LayerEvents scratch
	logitsH []float32
	nextH   int32
}

// New builds c on GPU 0 with weights from seed (those of model.NewCPU with
// the same seed) over the KV region at region, numSlots blocks of
// c.BlockBytes(), allocated by the caller in the primary context.
func New(c model.Config, seed uint64, region cudastream.DevicePtr, numSlots int, o Options) (*Model, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.HeadDim != 64 && c.HeadDim != 128 {
		return nil, fmt.Errorf("gpu: HeadDim %d: the attention kernels are built for 64 and 128", c.HeadDim)
	}
	if region == 0 || numSlots <= 0 {
		return nil, fmt.Errorf("gpu: New: a KV region (got %#x) of positive numSlots (got %d) is required", region, numSlots)
	}
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ptx := C.CString(modelPTX)
	defer C.free(unsafe.Pointer(ptx))
	var step C.int
	var rc C.gmResult
	var errbuf [512]C.char
	lib := C.gmOpen(ptx, &step, &rc, &errbuf[0], C.size_t(len(errbuf)))
	if lib == nil {
		msg := C.GoString(&errbuf[0])
		switch step {
		case C.gmStepDlopenCuda, C.gmStepDlopenCublas:
			return nil, fmt.Errorf("gpu: %s: %w", msg, cudastream.ErrNoDriver)
		case C.gmStepInit, C.gmStepDevice:
			if rc == 100 { // CUDA_ERROR_NO_DEVICE
				return nil, fmt.Errorf("gpu: no CUDA device: %w", cudastream.ErrNoDriver)
			}
		}
		return nil, fmt.Errorf("gpu: open: %s", msg)
	}
	m := &Model{cfg: c, o: o, lib: lib, region: ptr(region), numSlots: numSlots, chunk: o.maxChunk(c.QHeads)}
	if err := m.build(seed); err != nil {
		m.close()
		return nil, err
	}
	return m, nil
}

func (m *Model) errf(op string, rc C.gmResult) error {
	return fmt.Errorf("gpu: %s: %s (%d)", op, C.GoString(C.gmErrorName(m.lib, rc)), int(rc))
}

func (m *Model) alloc(what string, bytes int64) (ptr, error) {
	var p ptr
	if rc := C.gmAlloc(m.lib, &p, C.size_t(bytes)); rc != 0 {
		return 0, m.errf(fmt.Sprintf("cuMemAlloc %s (%d bytes)", what, bytes), rc)
	}
	m.allocs = append(m.allocs, p)
	return p, nil
}

// build loads the kernels, makes the weights on the device and allocates
// the scratch. The OS thread is locked with the context current.
func (m *Model) build(seed uint64) error {
	for k, name := range kernelNames {
		if err := m.function(name, false, &m.fn[k]); err != nil {
			return err
		}
	}
	for _, k := range []kernel{kFlash64, kFlash128} {
		if rc := C.gmSharedBytes(m.lib, m.fn[k], C.int(flashShared(k))); rc != 0 {
			return m.errf("cuFuncSetAttribute "+kernelNames[k], rc)
		}
	}
	if err := m.pickAttention(); err != nil {
		return err
	}
	c, o := m.cfg, m.o
	ts := model.TensorsOf(c)
	weight := func(t model.Tensor) (ptr, error) {
		p, err := m.alloc(t.Name, t.Elems()*2)
		if err != nil {
			return 0, err
		}
		grid := uint32(min((t.Elems()+255)/256, 132*16))
		err = m.launch(kInit, grid, 1, 256, uint64(p), uint64(t.Elems()), seed, uint64(t.ID), uint64(t.Lim),
			f32(float32(math.Ldexp(1, -t.Shift))), f32(t.Offset))
		return p, err
	}
	var err error
	if m.embed, err = weight(ts.Embed); err != nil {
		return err
	}
	if m.final, err = weight(ts.FinalNorm); err != nil {
		return err
	}
	m.lmHead = m.embed
	if !c.TieEmbeddings {
		if m.lmHead, err = weight(ts.LMHead); err != nil {
			return err
		}
	}
	m.layers = make([][model.NumLayerTensors]ptr, c.Layers)
	for l := range m.layers {
		for i, t := range ts.Layer[l] {
			if m.layers[l][i], err = weight(t); err != nil {
				return err
			}
		}
	}
	cos, sin := model.RopeTables(c, o.MaxContext)
	if m.cos, err = m.upload("rope cos", unsafe.Pointer(&cos[0]), int64(len(cos))*4); err != nil {
		return err
	}
	if m.sin, err = m.upload("rope sin", unsafe.Pointer(&sin[0]), int64(len(sin))*4); err != nil {
		return err
	}
	// The products' rows (Options.rows) may pass MaxTokens: the padding
	// rows of the activations are read and written, never used.
	n, h, qw := int64(o.rows(o.MaxTokens)), int64(c.Hidden), int64(c.QHeads*c.HeadDim)
	kvw := int64(c.KVHeads*c.HeadDim) * int64(o.keyCap())
	scores := int64(c.QHeads) * int64(m.chunk) * int64(o.keyCap())
	for _, b := range []struct {
		p     *ptr
		name  string
		bytes int64
	}{
		{&m.x, "residual", n * h * 4}, {&m.xn, "normed", n * h * 2}, {&m.qkv, "qkv", n * int64(c.QKVWidth()) * 2},
		{&m.q, "q", n * qw * 2}, {&m.att, "attention out", n * qw * 2}, {&m.gu, "gate/up", n * 2 * int64(c.Intermediate) * 2},
		{&m.act, "mlp act", n * int64(c.Intermediate) * 2}, {&m.kc, "K scratch", kvw * 2}, {&m.vc, "V scratch", kvw * 2},
		{&m.s, "scores", scores * 4}, {&m.p, "probabilities", scores * 2}, {&m.logits, "logits", int64(c.Vocab) * 4},
		{&m.next, "argmax", 8}, {&m.tok, "tokens", n * 4}, {&m.pos, "positions", n * 4},
		{&m.slots, "slots", int64(c.Blocks(o.MaxContext)) * 4},
	} {
		if *b.p, err = m.alloc(b.name, b.bytes); err != nil {
			return err
		}
		// Zeroed once, so that padding rows hold finite values from the
		// start (fresh memory may hold NaN patterns; they would stay in
		// their own rows, but a reader of a dump should not meet them).
		if rc := C.gmMemset(m.lib, *b.p, C.size_t(b.bytes)); rc != 0 {
			return m.errf("zero "+b.name, rc)
		}
	}
	m.hostTok = make([]int32, o.MaxTokens)
	m.logitsH = make([]float32, c.Vocab)
	if rc := C.gmSync(m.lib); rc != 0 {
		return m.errf("weights", rc)
	}
	return nil
}

// function finds kernel name in kernels/model.ptx's module, or in
// kernels/hopper.ptx's.
func (m *Model) function(name string, hopper bool, f *C.gmFunc) error {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	var rc C.gmResult
	if hopper {
		rc = C.gmHopperFunction(m.lib, cn, f)
	} else {
		rc = C.gmFunction(m.lib, cn, f)
	}
	if rc != 0 {
		return m.errf("cuModuleGetFunction "+name, rc)
	}
	return nil
}

// pickAttention loads the Hopper kernels where Options.Attention and the
// device call for them.
func (m *Model) pickAttention() error {
	var major, minor C.int
	if rc := C.gmComputeCapability(m.lib, &major, &minor); rc != 0 {
		return m.errf("cuDeviceGetAttribute (compute capability)", rc)
	}
	m.cc = [2]int{int(major), int(minor)}
	runs := major == 9 && m.cfg.HeadDim == 128
	switch m.o.Attention {
	case AttentionMMA:
		return nil
	case AttentionAuto:
		if !runs {
			return nil
		}
	case AttentionWGMMA:
		if !runs {
			return fmt.Errorf("gpu: Options.Attention %v needs compute capability 9.x and head dim 128; the device is %d.%d, the model's head dim %d", m.o.Attention, major, minor, m.cfg.HeadDim)
		}
	}
	ptx := C.CString(hopperPTX)
	defer C.free(unsafe.Pointer(ptx))
	if rc := C.gmLoadHopper(m.lib, ptx); rc != 0 {
		err := m.errf("cuModuleLoadData (kernels/hopper.ptx)", rc)
		if m.o.Attention == AttentionAuto {
			// A driver older than the PTX (ISA 9.0, CUDA 13) cannot
			// load it: the mma kernel serves, and AttentionKernel says
			// why.
			m.hopperErr = err
			return nil
		}
		return err
	}
	for k, name := range hopperNames {
		if err := m.function(name, true, &m.fnH[k]); err != nil {
			return err
		}
	}
	if rc := C.gmSharedBytes(m.lib, m.fnH[hFlash], hopperFlashShared); rc != 0 {
		return m.errf("cuFuncSetAttribute "+hopperNames[hFlash], rc)
	}
	m.hopper = true
	return nil
}

// Attention is the fused attention kernel the passes of
// Options.FusedMinTokens rows or more run: AttentionWGMMA or AttentionMMA.
func (m *Model) Attention() Attention {
	if m.hopper {
		return AttentionWGMMA
	}
	return AttentionMMA
}

// ComputeCapability is the device's.
func (m *Model) ComputeCapability() (major, minor int) { return m.cc[0], m.cc[1] }

// AttentionRows is the query rows one CTA of the fused attention kernel
// takes (hopper.cu's BM, model.cu's FA_ROWS): a pass runs a CTA per tile
// of that many rows and per head, so times the SMs it is the rows × heads
// of one wave (cost.Calibration.SetAttentionWave).
func (m *Model) AttentionRows() int {
	if m.hopper {
		return 128
	}
	return 64
}

// AttentionKernel names the fused attention kernel that passes of
// Options.FusedMinTokens rows or more run, and the device's compute
// capability.
func (m *Model) AttentionKernel() string {
	var k string
	switch {
	case m.hopper:
		k = hopperNames[hFlash] + " (wgmma)"
	case m.cfg.HeadDim == 64:
		k = kernelNames[kFlash64] + " (mma.sync)"
	default:
		k = kernelNames[kFlash128] + " (mma.sync)"
	}
	if m.hopperErr != nil {
		k += fmt.Sprintf(" (the wgmma kernel did not load: %v)", m.hopperErr)
	}
	return fmt.Sprintf("%s on compute capability %d.%d", k, m.cc[0], m.cc[1])
}

func (m *Model) upload(what string, src unsafe.Pointer, bytes int64) (ptr, error) {
	p, err := m.alloc(what, bytes)
	if err != nil {
		return 0, err
	}
	if rc := C.gmHtoD(m.lib, p, src, C.size_t(bytes)); rc != 0 {
		return 0, m.errf("upload "+what, rc)
	}
	return p, nil
}

func f32(f float32) uint64 { return uint64(math.Float32bits(f)) }
func i32(v int) uint64     { return uint64(uint32(int32(v))) }

func (m *Model) launch(k kernel, gx, gy, bx uint32, args ...uint64) error {
	return m.launchShared(k, gx, gy, bx, 0, args...)
}

func (m *Model) launchShared(k kernel, gx, gy, bx, shared uint32, args ...uint64) error {
	return m.launchFunc(m.fn[k], kernelNames[k], gx, gy, bx, shared, args...)
}

func (m *Model) launchFunc(f C.gmFunc, name string, gx, gy, bx, shared uint32, args ...uint64) error {
	n := copy(m.args[:], args)
	if rc := C.gmLaunch(m.lib, f, C.uint(gx), C.uint(gy), C.uint(bx), C.uint(shared), (*C.uint64_t)(unsafe.Pointer(&m.args[0])), C.int(n)); rc != 0 {
		return m.errf("launch "+name, rc)
	}
	return nil
}

// mark starts stage name on the device's timeline (Options.StageTimes);
// "" ends the pass. Past the event limit a stage's time goes to the one
// before it.
func (m *Model) mark(name string) error {
	// The last event is kept for the pass's end.
	if !m.o.StageTimes || len(m.marks) >= C.GM_MAX_EVENTS-1 && name != "" {
		return nil
	}
	if rc := C.gmMark(m.lib, C.int(len(m.marks))); rc != 0 {
		return m.errf("cuEventRecord (stage "+name+")", rc)
	}
	m.marks = append(m.marks, name)
	return nil
}

// collect adds the finished pass's marks to m.stages.
func (m *Model) collect() error {
	defer func() { m.marks = m.marks[:0] }()
	for i := 0; i+1 < len(m.marks); i++ {
		var ms C.float
		if rc := C.gmElapsed(m.lib, C.int(i), C.int(i+1), &ms); rc != 0 {
			return m.errf("cuEventElapsedTime", rc)
		}
		name, j := m.marks[i], 0
		for j < len(m.stages) && m.stages[j].Name != name {
			j++
		}
		if j == len(m.stages) {
			m.stages = append(m.stages, StageTime{Name: name})
		}
		m.stages[j].Seconds += float64(ms) / 1e3
	}
	return nil
}

// SetStageTimes turns Options.StageTimes on or off for the passes after
// it.
func (m *Model) SetStageTimes(on bool) { m.o.StageTimes = on }

// Stages returns the device time per stage of the passes since the last
// call, in the order the stages first ran (Options.StageTimes; nil
// without).
func (m *Model) Stages() []StageTime {
	s := m.stages
	m.stages = nil
	return s
}

// product runs m.gemm.
func (m *Model) product(what string) error {
	if st := C.gmGemmRun(m.lib, &m.gemm); st != 0 {
		return fmt.Errorf("gpu: cuBLAS %s: status %d", what, int(st))
	}
	return nil
}

// store says what a product does with its output.
type store int

const (
	storeBF16 store = iota // activations
	addF32                 // added to the fp32 residual
	storeF32               // the logits
)

// linear: y[n][out] = x[n][in] · w[out][in]ᵀ, stored or added as st says.
func (m *Model) linear(what string, y, x, w ptr, n, in, out int, st store) error {
	m.gemm = C.gmGemm{transa: opT, transb: opN, m: C.int(out), n: C.int(n), k: C.int(in), alpha: 1,
		a: w, b: x, c: y, atype: typeBF, btype: typeBF, ctype: typeBF, lda: C.int(in), ldb: C.int(in), ldc: C.int(out), batch: 1}
	switch st {
	case addF32:
		m.gemm.beta, m.gemm.ctype = 1, typeF32
	case storeF32:
		m.gemm.ctype = typeF32
	}
	return m.product(what)
}

// Library names the cuBLAS library in use.
func (m *Model) Library() string { return C.GoString(&m.lib.cublasName[0]) }

// Forward is model.CPU.Forward on the GPU: it computes the positions
// p.Compute lists over tokens, writing their KV into their blocks, and
// returns the last position's logits (valid until the next call) and the
// greedy next token. It returns once the GPU is done.
func (m *Model) Forward(tokens []int32, p model.Plan) ([]float32, int32, error) {
	c, o := m.cfg, m.o
	if err := c.Check(tokens, p, m.numSlots); err != nil {
		return nil, 0, err
	}
	n, nc := len(tokens), len(p.Compute)
	if nc > o.MaxTokens || n > o.MaxContext {
		return nil, 0, fmt.Errorf("gpu: forward: %d positions to compute in a sequence of %d; this model takes at most %d in %d (Options)", nc, n, o.MaxTokens, o.MaxContext)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if rc := C.gmSetCurrent(m.lib); rc != 0 {
		return nil, 0, m.errf("cuCtxSetCurrent", rc)
	}
	for i, q := range p.Compute {
		m.hostTok[i] = tokens[q]
	}
	for _, u := range []struct {
		dst ptr
		src *int32
		n   int
	}{{m.tok, &m.hostTok[0], nc}, {m.pos, &p.Compute[0], nc}, {m.slots, &p.Slots[0], len(p.Slots)}} {
		if rc := C.gmHtoD(m.lib, u.dst, unsafe.Pointer(u.src), C.size_t(u.n*4)); rc != 0 {
			return nil, 0, m.errf("upload the plan", rc)
		}
	}
	m.marks = m.marks[:0]
	if err := m.forward(p, n, nc); err != nil {
		// The layers enqueued before the error still read and write the
		// region: drain them, so that no slot the caller frees is written
		// after Forward returns.
		if rc := C.gmSync(m.lib); rc != 0 {
			err = fmt.Errorf("%w (and %w)", err, m.errf("synchronize after the failed pass", rc))
		}
		return nil, 0, err
	}
	if rc := C.gmDtoH(m.lib, unsafe.Pointer(&m.logitsH[0]), m.logits, C.size_t(c.Vocab*4)); rc != 0 {
		return nil, 0, m.errf("read the logits", rc)
	}
	if rc := C.gmDtoH(m.lib, unsafe.Pointer(&m.nextH), m.next, 4); rc != 0 {
		return nil, 0, m.errf("read the argmax", rc)
	}
	if err := m.collect(); err != nil {
		return nil, 0, err
	}
	return m.logitsH, m.nextH, nil
}

// forward runs the layers over the nc positions to compute of a sequence
// of n. Every per-row kernel runs over the nc rows; the linear layers'
// products over pr = Options.rows(nc) rows, so that their shapes repeat
// from pass to pass. A product's output row depends on its input row
// alone, so the pr-nc padding rows change nothing in the others: they
// hold what earlier passes left in the activations (the residual's are
// zeroed each pass, so that nothing accumulates there), are never
// normalized, attended or stored in a block.
func (m *Model) forward(p model.Plan, n, nc int) error {
	c := m.cfg
	h, d, qw, inter := c.Hidden, c.HeadDim, c.QHeads*c.HeadDim, c.Intermediate
	bb, pb := uint64(c.BlockBytes()), uint64(c.PartBytes())
	pr := m.o.rows(nc)
	hopper := m.hopper && nc >= m.o.FusedMinTokens
	if err := m.mark("embed"); err != nil {
		return err
	}
	if pr > nc {
		if rc := C.gmMemset(m.lib, m.x+ptr(nc*h*4), C.size_t((pr-nc)*h*4)); rc != 0 {
			return m.errf("zero the residual's padding rows", rc)
		}
	}
	if err := m.launch(kEmbed, uint32(nc), 1, 256, uint64(m.tok), uint64(m.embed), uint64(m.x), i32(h)); err != nil {
		return err
	}
	gatherThreads := uint32(min(128, c.KVHeads*d/8))
	for l := range c.Layers {
		if err := m.mark("wait for the layer's KV"); err != nil {
			return err
		}
		if err := m.waitLayer(p, l); err != nil {
			return err
		}
		w := &m.layers[l]
		if err := m.markLaunch("norms", kRMSNorm, uint32(nc), 1, 256, uint64(m.x), uint64(w[model.AttnNorm]), uint64(m.xn), i32(h), f32(c.NormEps)); err != nil {
			return err
		}
		if err := m.mark("qkv product"); err != nil {
			return err
		}
		if err := m.linear("qkv", m.qkv, m.xn, w[model.QKV], pr, h, c.QKVWidth(), storeBF16); err != nil {
			return err
		}
		if err := m.markLaunch("rotary + KV store", kRope, uint32(nc), 1, 128, uint64(m.qkv), uint64(m.q), uint64(m.region), uint64(m.pos),
			uint64(m.slots), uint64(m.cos), uint64(m.sin), i32(c.QHeads), i32(c.KVHeads), i32(d), i32(c.BlockTokens), bb, pb, i32(l)); err != nil {
			return err
		}
		if err := m.mark("gather"); err != nil {
			return err
		}
		var err error
		if hopper {
			err = m.launchFunc(m.fnH[hGatherT], hopperNames[hGatherT], uint32((n+63)/64), uint32(c.KVHeads), 256, 0, uint64(m.region), uint64(m.slots),
				uint64(m.kc), uint64(m.vc), i32(c.KVHeads), i32(c.BlockTokens), bb, pb, i32(l), uint64(m.o.keyCap()), i32(n))
		} else {
			err = m.launch(kGather, uint32(n), 1, gatherThreads, uint64(m.region), uint64(m.slots), uint64(m.kc), uint64(m.vc),
				i32(c.KVHeads), i32(d), i32(c.BlockTokens), bb, pb, i32(l), uint64(m.o.keyCap()))
		}
		if err != nil {
			return err
		}
		if err := m.mark("attention"); err != nil {
			return err
		}
		if err := m.attend(p, nc, hopper); err != nil {
			return err
		}
		if err := m.mark("out product"); err != nil {
			return err
		}
		if err := m.linear("out", m.x, m.att, w[model.Out], pr, qw, h, addF32); err != nil {
			return err
		}
		if err := m.markLaunch("norms", kRMSNorm, uint32(nc), 1, 256, uint64(m.x), uint64(w[model.MLPNorm]), uint64(m.xn), i32(h), f32(c.NormEps)); err != nil {
			return err
		}
		if err := m.mark("gate/up product"); err != nil {
			return err
		}
		if err := m.linear("gate/up", m.gu, m.xn, w[model.GateUp], pr, h, 2*inter, storeBF16); err != nil {
			return err
		}
		if err := m.markLaunch("SiLU", kSiLU, uint32(nc), 1, 256, uint64(m.gu), uint64(m.act), i32(inter)); err != nil {
			return err
		}
		if err := m.mark("down product"); err != nil {
			return err
		}
		if err := m.linear("down", m.x, m.act, w[model.Down], pr, inter, h, addF32); err != nil {
			return err
		}
	}
	if err := m.mark("final norm + lm head + argmax"); err != nil {
		return err
	}
	last := m.x + ptr((nc-1)*h*4)
	if err := m.launch(kRMSNorm, 1, 1, 256, uint64(last), uint64(m.final), uint64(m.xn), i32(h), f32(c.NormEps)); err != nil {
		return err
	}
	if err := m.linear("lm head", m.logits, m.xn, m.lmHead, 1, h, c.Vocab, storeF32); err != nil {
		return err
	}
	if err := m.launch(kArgmax, 1, 1, 1024, uint64(m.logits), i32(c.Vocab), uint64(m.next)); err != nil {
		return err
	}
	return m.mark("")
}

// markLaunch marks stage and launches k, the stage's one kernel.
func (m *Model) markLaunch(stage string, k kernel, gx, gy, bx uint32, args ...uint64) error {
	if err := m.mark(stage); err != nil {
		return err
	}
	return m.launch(k, gx, gy, bx, args...)
}

// waitLayer makes layer l wait for its KV: on the device when p has
// LayerEvents (the legacy default stream, which every kernel and product
// of the pass runs on, waits on each event), else on the host (p.Ready).
func (m *Model) waitLayer(p model.Plan, l int) error {
	if p.LayerEvents == nil {
		if p.Ready != nil {
			if err := p.Ready(l); err != nil {
				return fmt.Errorf("gpu: forward: layer %d not ready: %w", l, err)
			}
		}
		return nil
	}
	var err error
	if m.events, err = p.LayerEvents(l, m.events[:0]); err != nil {
		return fmt.Errorf("gpu: forward: layer %d's events: %w", l, err)
	}
	for i, ev := range m.events {
		h, err := cudastream.EventHandle(ev)
		if err != nil {
			return fmt.Errorf("gpu: forward: layer %d's event %d: %w", l, i, err)
		}
		if rc := C.gmWaitEvent(m.lib, C.uintptr_t(h)); rc != 0 {
			return m.errf(fmt.Sprintf("cuStreamWaitEvent (layer %d, event %d)", l, i), rc)
		}
	}
	clear(m.events) // hold no event past the pass
	return nil
}

// WarmUp runs one pass of each row bucket up to Options.MaxTokens
// (RowBuckets; a pass of min(bucket, MaxTokens) rows from position 0),
// then short passes after prefixes of growing length for the attention
// products (attentionWarmUps), writing their KV into slots, which MUST be
// distinct and not hold KV anyone needs: a server's scratch slots before
// it serves. After it, a pass meets no linear product's shape for the
// first time, and the attention products' kernels are loaded. Passes that
// do not fit the slots are skipped. It returns how many passes it ran;
// with Options.ExactRows, none.
func (m *Model) WarmUp(slots []int32) (int, error) {
	if m.o.ExactRows {
		return 0, nil
	}
	bt := m.cfg.BlockTokens
	rows := min(m.o.MaxTokens, len(slots)*bt)
	tok := make([]int32, rows)
	pos := make([]int32, rows)
	for i := range pos {
		pos[i] = int32(i)
	}
	passes, filled := 0, 0
	for _, b := range RowBuckets(m.o.MaxTokens) {
		n := min(b, m.o.MaxTokens)
		if n > rows {
			break
		}
		if _, _, err := m.Forward(tok[:n], model.Plan{Slots: slots[:m.cfg.Blocks(n)], Compute: pos[:n]}); err != nil {
			return passes, fmt.Errorf("gpu: warm-up pass of %d rows: %w", n, err)
		}
		passes, filled = passes+1, n
	}
	// The largest pass above left KV in every position below filled.
	for _, kr := range m.o.attentionWarmUps(filled) {
		keys, r := kr[0], kr[1]
		if _, _, err := m.Forward(tok[:keys], model.Plan{Slots: slots[:m.cfg.Blocks(keys)], Compute: pos[keys-r : keys]}); err != nil {
			return passes, fmt.Errorf("gpu: warm-up pass of %d rows after %d: %w", r, keys-r, err)
		}
		passes++
	}
	return passes, nil
}

// flashShared is the fused kernel's dynamic shared memory: two stages of a
// K and a V tile, 64 keys of (head dim + 8) bf16 each.
func flashShared(k kernel) uint32 {
	hd := 128
	if k == kFlash64 {
		hd = 64
	}
	return 2 * 2 * 64 * uint32(hd+8) * 2
}

// attend computes m.att from m.q and the gathered K and V: the fused
// kernel for Options.FusedMinTokens rows or more (kvm_flash_h128 over the
// transposed V when hopper), else products per chunk.
func (m *Model) attend(p model.Plan, nc int, hopper bool) error {
	c := m.cfg
	scale := f32(float32(1 / math.Sqrt(float64(c.HeadDim))))
	if hopper {
		// m.vc holds V transposed (kvm_gather_t).
		return m.launchFunc(m.fnH[hFlash], hopperNames[hFlash], uint32(c.QHeads), uint32((nc+127)/128), 256, hopperFlashShared,
			uint64(m.q), uint64(m.kc), uint64(m.vc), uint64(m.att), uint64(m.pos), i32(nc), i32(c.QHeads), i32(c.QHeads/c.KVHeads),
			uint64(m.o.keyCap()), scale)
	}
	if nc >= m.o.FusedMinTokens {
		k := kFlash128
		if c.HeadDim == 64 {
			k = kFlash64
		}
		return m.launchShared(k, uint32((nc+63)/64), uint32(c.QHeads), 128, flashShared(k), uint64(m.q), uint64(m.kc), uint64(m.vc),
			uint64(m.att), uint64(m.pos), i32(nc), i32(c.QHeads), i32(c.QHeads/c.KVHeads), uint64(m.o.keyCap()), scale)
	}
	for c0 := 0; c0 < nc; c0 += m.chunk {
		if err := m.attention(p, c0, min(m.chunk, nc-c0)); err != nil {
			return err
		}
	}
	return nil
}

// attention for computed rows [c0, c0+rows): scores against keys [0,
// Options.keys(last position of the chunk + 1)), masked softmax (each row
// over the keys up to its position), times V into m.att.
func (m *Model) attention(p model.Plan, c0, rows int) error {
	c := m.cfg
	d, group, qw := c.HeadDim, c.QHeads/c.KVHeads, c.QHeads*c.HeadDim
	keys := m.o.keys(int(p.Compute[c0+rows-1]) + 1)
	capElems := int64(m.o.keyCap()) * int64(d)
	for j := range group {
		m.gemm = C.gmGemm{transa: opT, transb: opN, m: C.int(keys), n: C.int(rows), k: C.int(d),
			alpha: C.float(1 / math.Sqrt(float64(d))),
			a:     m.kc, b: m.q + ptr((c0*qw+j*d)*2), c: m.s + ptr(j*rows*keys*4),
			atype: typeBF, btype: typeBF, ctype: typeF32, lda: C.int(d), ldb: C.int(qw), ldc: C.int(keys),
			strideA: C.longlong(capElems), strideB: C.longlong(group * d), strideC: C.longlong(group * rows * keys),
			batch: C.int(c.KVHeads)}
		if err := m.product("scores"); err != nil {
			return err
		}
	}
	if err := m.launch(kSoftmax, uint32(rows), uint32(c.QHeads), 256, uint64(m.s), uint64(m.p), uint64(m.pos+ptr(c0*4)), i32(rows), i32(keys)); err != nil {
		return err
	}
	for j := range group {
		m.gemm = C.gmGemm{transa: opN, transb: opN, m: C.int(d), n: C.int(rows), k: C.int(keys), alpha: 1,
			a: m.vc, b: m.p + ptr(j*rows*keys*2), c: m.att + ptr((c0*qw+j*d)*2),
			atype: typeBF, btype: typeBF, ctype: typeBF, lda: C.int(d), ldb: C.int(keys), ldc: C.int(qw),
			strideA: C.longlong(capElems), strideB: C.longlong(group * rows * keys), strideC: C.longlong(group * d),
			batch: C.int(c.KVHeads)}
		if err := m.product("attention × V"); err != nil {
			return err
		}
	}
	return nil
}

// Close frees the model's memory and releases its hold on the context.
func (m *Model) Close() error {
	if m == nil || m.lib == nil {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err := m.close()
	return err
}

func (m *Model) close() error {
	var first error
	if rc := C.gmSetCurrent(m.lib); rc != 0 {
		first = m.errf("cuCtxSetCurrent", rc)
	}
	if rc := C.gmSync(m.lib); rc != 0 && first == nil {
		first = m.errf("synchronize before free", rc)
	}
	for _, p := range m.allocs {
		if rc := C.gmFree(m.lib, p); rc != 0 && first == nil {
			first = m.errf("cuMemFree", rc)
		}
	}
	m.allocs = nil
	C.gmClose(m.lib)
	m.lib = nil
	return first
}
