package cost

import (
	"fmt"
	"strings"
)

// GPU is what prefill runs at on one device.
type GPU struct {
	Name string
	// PeakFLOPS is the datasheet's dense bf16 tensor-core rate.
	PeakFLOPS float64
	// Efficiency is the fraction of PeakFLOPS a long prefill gets, (0, 1]:
	// 0.6 on an H100 means 593 TFLOP/s.
	Efficiency float64
	// HBMBytesPerS sets the pass floor, e.g. 4.8e12 (0: no floor);
	// MemoryBytes must hold the weights and the KV, e.g. 141e9 (0: unchecked).
	HBMBytesPerS float64
	MemoryBytes  int64
	Source       string // where the figures come from
}

// EffectiveFLOPS is PeakFLOPS × Efficiency.
func (g *GPU) EffectiveFLOPS() float64 { return g.PeakFLOPS * g.Efficiency }

// Validate rejects a non-positive or absurd rate, naming the field.
func (g *GPU) Validate() error {
	if !(g.PeakFLOPS > 0) || g.PeakFLOPS > maxFLOPS {
		return fieldErr("tflops", g.PeakFLOPS/1e12, "peak must be positive and at most %g TFLOP/s", maxFLOPS/1e12)
	}
	if !(g.Efficiency > 0) || g.Efficiency > 1 {
		return fieldErr("efficiency", g.Efficiency, "must be in (0, 1]")
	}
	if g.HBMBytesPerS < 0 || g.HBMBytesPerS > maxHBMBytesS {
		return fieldErr("hbm_bandwidth", g.HBMBytesPerS/1e12, "must be between 0 (unknown) and %g TB/s", maxHBMBytesS/1e12)
	}
	if g.MemoryBytes < 0 || g.MemoryBytes > maxMemoryBytes {
		return fieldErr("memory_bytes", g.MemoryBytes, "must be between 0 (unknown) and %d", int64(maxMemoryBytes))
	}
	return nil
}

// Efficiency of prefill: long-context prefill on Hopper reaches 55-65% of
// dense peak in vLLM/SGLang profiles; the seed chapter's exercise takes
// "about 600 TFLOP/s effective" for an H100-class card, which is 0.6 of 989.
// Blackwell is younger and its kernels reach a smaller fraction today; 0.5 is
// a judgment, to be replaced by a measurement (--efficiency).
const (
	hopperPrefillEfficiency    = 0.6
	blackwellPrefillEfficiency = 0.5
)

var gpuPresets = map[string]GPU{
	"h100-sxm": {Name: "h100-sxm", PeakFLOPS: 989e12, Efficiency: hopperPrefillEfficiency,
		HBMBytesPerS: 3.35e12, MemoryBytes: 80e9,
		Source: "NVIDIA H100 datasheet: 989 TFLOP/s dense BF16 (1,979 with sparsity), SXM5; 80 GB HBM3 at 3.35 TB/s"},
	"h200": {Name: "h200", PeakFLOPS: 989e12, Efficiency: hopperPrefillEfficiency,
		HBMBytesPerS: 4.8e12, MemoryBytes: 141e9,
		Source: "NVIDIA H200 datasheet: 989 TFLOP/s dense BF16 (same die as H100 SXM); 141 GB HBM3e at 4.8 TB/s (kvtier probe on the project's H200: 150,109,880,320 bytes)"},
	"gh200": {Name: "gh200", PeakFLOPS: 989e12, Efficiency: hopperPrefillEfficiency,
		HBMBytesPerS: 4.0e12, MemoryBytes: 96e9,
		Source: "NVIDIA GH200 datasheet: 989 TFLOP/s dense BF16 on the Hopper GPU; 96 GB HBM3 at 4 TB/s (the 144 GB HBM3e part has 4.9)"},
	"b200": {Name: "b200", PeakFLOPS: 2.25e15, Efficiency: blackwellPrefillEfficiency,
		HBMBytesPerS: 8e12, MemoryBytes: 180e9,
		Source: "NVIDIA HGX B200 datasheet: 4.5 PFLOP/s BF16 with sparsity per GPU, 2.25 dense; 180 GB HBM3e at 8 TB/s per GPU"},
	"gb200": {Name: "gb200", PeakFLOPS: 2.5e15, Efficiency: blackwellPrefillEfficiency,
		HBMBytesPerS: 8e12, MemoryBytes: 186e9,
		Source: "NVIDIA GB200 NVL72 datasheet: 180 PFLOP/s dense BF16, 13.4 TB HBM3e at 576 TB/s over 72 GPUs: 2.5 PFLOP/s, 186 GB and 8 TB/s per GPU"},
}

// GPUNames lists the GPU presets, sorted.
func GPUNames() []string { return sortedKeys(gpuPresets) }

// LookupGPU returns a copy of the named preset (case-insensitive).
func LookupGPU(name string) (GPU, error) {
	g, ok := gpuPresets[strings.ToLower(name)]
	if !ok {
		return GPU{}, fmt.Errorf("gpu %q: %w; known: %s", name, ErrUnknownName, strings.Join(GPUNames(), ", "))
	}
	return g, nil
}
