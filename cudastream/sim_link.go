package cudastream

import (
	"fmt"
	"math"
	"time"
)

// LinkModel is how long the simulated device takes to move bytes. A copy
// occupies one copy engine of its direction for
//
//	CopyLatency + descriptors*DescriptorCost + bytes/bandwidth
//
// (descriptors counts only for CopyBatch), rounded to the nearest nanosecond.
// Zero values mean instantaneous: the zero LinkModel moves any amount of data
// in no time, which is what most unit tests above this package want.
type LinkModel struct {
	// Bandwidth per direction from pinned (registered or HostAlloc'd) host
	// memory, in bytes per second. Example: 49.4 GiB/s is 49.4*(1<<30).
	HtoDBytesPerSec float64
	DtoHBytesPerSec float64
	DtoDBytesPerSec float64

	// Bandwidth of single copies whose host slice lies outside every
	// registered range (pageable memory: the driver stages it through its own
	// pinned buffers). Zero means "as fast as pinned": pageable memory is
	// never modelled faster than pinned memory.
	PageableHtoDBytesPerSec float64
	PageableDtoHBytesPerSec float64

	// CopyLatency is the fixed cost of each copy call (single or batch): the
	// issue cost plus the DMA start. The H200 issues a small
	// cuMemcpyHtoDAsync in about 3 us.
	CopyLatency time.Duration
	// DescriptorCost is added per descriptor of a CopyBatch (about 0.5 us on
	// the H200).
	DescriptorCost time.Duration
	// EventCost is how long a recorded event occupies its stream (0.32 us
	// for cuEventRecord + cuEventQuery on the H200).
	EventCost time.Duration
	// KernelLaunch is the fixed cost of a CopyKernel call (the descriptor
	// upload and the launches); a copy kernel has no per-descriptor cost
	// and moves bytes at the direction's pinned bandwidth.
	KernelLaunch time.Duration

	// Engines is the number of copy engines per direction, indexed by
	// CopyKind. Copies of one direction on different streams share these
	// engines and queue for them; different directions run concurrently.
	// Zero means one engine.
	Engines [NumCopyKinds]int
}

// H200Link is the link measured on the H200 test machine (design.md,
// 2026-11-29): pinned 49.4 GiB/s host to device and 51.4 GiB/s device to
// host, pageable 5.4 and 10.5 GiB/s, about 3 us to issue a single copy, about
// 0.5 us per batch descriptor, 0.32 us per event, one engine per direction,
// and about 10 us per copy-kernel call (a descriptor upload and a launch per
// 4096 pieces: 16,384 pieces issued in 190 us there). The real copy kernel
// moves 44-47 GiB/s, a little under the engines' rate; the model gives it
// the engines' rate.
//
// Device-to-device bandwidth was not measured there and is left at zero
// (instantaneous); set DtoDBytesPerSec if a test depends on it. The model
// also does not cap the sum of both directions (the H200 reached 80.1 GiB/s
// both ways at once, less than 49.4+51.4): each direction runs at its own
// rate.
func H200Link() LinkModel {
	const gib = 1 << 30
	return LinkModel{
		HtoDBytesPerSec:         49.4 * gib,
		DtoHBytesPerSec:         51.4 * gib,
		PageableHtoDBytesPerSec: 5.4 * gib,
		PageableDtoHBytesPerSec: 10.5 * gib,
		CopyLatency:             3 * time.Microsecond,
		DescriptorCost:          500 * time.Nanosecond,
		EventCost:               320 * time.Nanosecond,
		KernelLaunch:            10 * time.Microsecond,
	}
}

// simMaxEngines bounds LinkModel.Engines; real GPUs have a handful.
const simMaxEngines = 64

func (l *LinkModel) validate() error {
	bws := []struct {
		name string
		v    float64
	}{
		{"HtoDBytesPerSec", l.HtoDBytesPerSec},
		{"DtoHBytesPerSec", l.DtoHBytesPerSec},
		{"DtoDBytesPerSec", l.DtoDBytesPerSec},
		{"PageableHtoDBytesPerSec", l.PageableHtoDBytesPerSec},
		{"PageableDtoHBytesPerSec", l.PageableDtoHBytesPerSec},
	}
	for _, b := range bws {
		if math.IsNaN(b.v) || math.IsInf(b.v, 0) || b.v < 0 {
			return simConfigError("Link."+b.name, "must be a finite number >= 0 (0 means instantaneous), got %v", b.v)
		}
	}
	durs := []struct {
		name string
		v    time.Duration
	}{
		{"CopyLatency", l.CopyLatency},
		{"DescriptorCost", l.DescriptorCost},
		{"EventCost", l.EventCost},
		{"KernelLaunch", l.KernelLaunch},
	}
	for _, d := range durs {
		if d.v < 0 {
			return simConfigError("Link."+d.name, "must be >= 0, got %v", d.v)
		}
	}
	for k, n := range l.Engines {
		if n < 0 || n > simMaxEngines {
			return simConfigError(fmt.Sprintf("Link.Engines[%v]", CopyKind(k)), "must be in [0, %d] (0 means one engine), got %d", simMaxEngines, n)
		}
	}
	return nil
}

// engines returns the number of engines of direction k (at least one).
func (l *LinkModel) engines(k CopyKind) int {
	if l.Engines[k] == 0 {
		return 1
	}
	return l.Engines[k]
}

// bandwidth returns the bytes per second of a copy of kind k; pinned says
// whether its host side lies in registered memory.
func (l *LinkModel) bandwidth(k CopyKind, pinned bool) float64 {
	switch k {
	case HostToDevice:
		if !pinned && l.PageableHtoDBytesPerSec > 0 {
			return l.PageableHtoDBytesPerSec
		}
		return l.HtoDBytesPerSec
	case DeviceToHost:
		if !pinned && l.PageableDtoHBytesPerSec > 0 {
			return l.PageableDtoHBytesPerSec
		}
		return l.DtoHBytesPerSec
	}
	return l.DtoDBytesPerSec
}

// copyCost is how long a copy occupies its engine. descriptors is 0 for a
// single copy and the descriptor count for a batch.
func (l *LinkModel) copyCost(k CopyKind, pinned bool, bytes int64, descriptors int) time.Duration {
	d := l.CopyLatency + time.Duration(descriptors)*l.DescriptorCost
	if bw := l.bandwidth(k, pinned); bw > 0 {
		d += time.Duration(math.Round(float64(bytes) / bw * 1e9))
	}
	return d
}

// kernelCost is how long a CopyKernel call of bytes in total occupies the
// direction's engine: the launch, then the bytes at the pinned bandwidth.
// (A real copy kernel runs on SMs, not on a copy engine; the model keeps it
// on the engine because the link, shared by both, is what limits it.)
func (l *LinkModel) kernelCost(k CopyKind, bytes int64) time.Duration {
	d := l.KernelLaunch
	if bw := l.bandwidth(k, true); bw > 0 {
		d += time.Duration(math.Round(float64(bytes) / bw * 1e9))
	}
	return d
}
