package cost

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Link is one hop: its achievable bandwidth (not the line rate) and the
// latency of one transfer.
type Link struct {
	Name               string
	BandwidthBytesPerS float64
	Latency            time.Duration
	Source             string
	// DescriptorCost and EventCost are the copy engine's issue costs on a
	// GPU's ingress, which the Planner prices in a pass's loads: an
	// onboard is one copy call per layer (Latency), with a descriptor per
	// block (DescriptorCost) and an event (EventCost) per layer. Zero on a
	// hop that is not an ingress (a drive, a NIC). Example: 500 ns and
	// 320 ns, the H200's (cudastream.H200Link), make an onboard of 31
	// blocks of a 32-layer model 0.51 ms dearer than its bytes alone.
	DescriptorCost, EventCost time.Duration
}

// Validate rejects a non-positive or absurd figure, naming the field.
func (l *Link) Validate() error {
	if !(l.BandwidthBytesPerS > 0) || l.BandwidthBytesPerS > maxBandwidthBytesS {
		return fieldErr("bandwidth", l.BandwidthBytesPerS/1e9, "must be positive and at most %g GB/s", maxBandwidthBytesS/1e9)
	}
	if l.Latency < 0 || l.Latency > maxLatencySeconds*time.Second {
		return fieldErr("latency", l.Latency, "must be between 0 and %ds", maxLatencySeconds)
	}
	if l.DescriptorCost < 0 || l.DescriptorCost > maxLatencySeconds*time.Second {
		return fieldErr("descriptor_cost", l.DescriptorCost, "must be between 0 and %ds", maxLatencySeconds)
	}
	if l.EventCost < 0 || l.EventCost > maxLatencySeconds*time.Second {
		return fieldErr("event_cost", l.EventCost, "must be between 0 and %ds", maxLatencySeconds)
	}
	return nil
}

// TransferTime is Latency + bytes / BandwidthBytesPerS.
func (l *Link) TransferTime(bytes int64) time.Duration {
	return seconds(l.Latency.Seconds() + float64(bytes)/l.BandwidthBytesPerS)
}

// Drives is n such drives striped: n times the bandwidth, same latency.
func (l Link) Drives(n int) (Link, error) {
	if n < 1 || n > 64 {
		return Link{}, fieldErr("drives", n, "must be between 1 and 64")
	}
	if n == 1 {
		return l, nil
	}
	l.Name = fmt.Sprintf("%s-x%d", l.Name, n)
	l.BandwidthBytesPerS *= float64(n)
	return l, nil
}

const gb = 1e9

// pageableH2D is kvtier probe's host-to-device rate from pageable memory on
// the project's H200 (h2d_pageable_bytes_per_s, rounded).
const pageableH2D = 6.8 * gb

// descriptorCost and eventCost are the copy engine's issue costs measured
// on the project's H200 (design.md: 0.5 us per batch descriptor, 0.32 us
// per cuEventRecord + cuEventQuery; cudastream.H200Link), which every GPU
// ingress preset and probed link takes: they are the driver's and the
// engine's, not the wire's.
const (
	descriptorCost = 500 * time.Nanosecond
	eventCost      = 320 * time.Nanosecond
)

// The link presets. Bandwidths are achievable rates, not line rates. Three
// the seed chapter tabulates (pinned-memory-dma-numa: PCIe 4.0 pinned 25
// GB/s, NVLink-C2C 450, 400 Gb/s RDMA 45) are taken as it gives them. The
// PCIe 5.0 figures are `kvtier probe` on the project's H200
// (benchmarks/results/probe-h200.json, TestPresetsAgreeWithProbe): 55.3 GB/s
// host to device from pinned memory, 2.1 us to issue a small copy, and 6.8
// GB/s from pageable memory. A pageable copy is the CPU's copy into the
// driver's staging buffer followed by the DMA, so the CPU sets its rate, not
// the link: every pageable preset takes the measured figure (the seed's 12
// GB/s for PCIe 4.0 is above what the H200 reached over PCIe 5.0).
// Latencies are one transfer's fixed cost: issuing a copy on pinned memory
// (it overlaps the copy before it, docs/cost.md), and the staging setup on
// pageable memory.
var linkPresets = map[string]Link{
	"pcie4-pinned": {Name: "pcie4-pinned", DescriptorCost: descriptorCost, EventCost: eventCost, BandwidthBytesPerS: 25 * gb, Latency: 3 * time.Microsecond,
		Source: "seed chapter: PCIe 4.0 x16 from pinned memory, 25 GB/s achievable"},
	"pcie4-pageable": {Name: "pcie4-pageable", DescriptorCost: descriptorCost, EventCost: eventCost, BandwidthBytesPerS: pageableH2D, Latency: 10 * time.Microsecond,
		Source: "bounded by the CPU staging copy, not the link: kvtier probe on the project's H200, 6.8 GB/s host to device from pageable memory (the seed chapter's 12 GB/s is above it)"},
	"pcie5-pinned": {Name: "pcie5-pinned", DescriptorCost: descriptorCost, EventCost: eventCost, BandwidthBytesPerS: 55.3 * gb, Latency: 2100 * time.Nanosecond,
		Source: "kvtier probe on the project's H200 (PCIe 5.0 x16): 55.3 GB/s host to device from pinned memory (51.5 GiB/s), 2.1 us to issue a small copy"},
	"pcie5-pageable": {Name: "pcie5-pageable", DescriptorCost: descriptorCost, EventCost: eventCost, BandwidthBytesPerS: pageableH2D, Latency: 10 * time.Microsecond,
		Source: "kvtier probe on the project's H200 (PCIe 5.0 x16): 6.8 GB/s host to device from pageable memory (14.3 device to host)"},
	"pcie6-pinned": {Name: "pcie6-pinned", DescriptorCost: descriptorCost, EventCost: eventCost, BandwidthBytesPerS: 100 * gb, Latency: 3 * time.Microsecond,
		Source: "PCIe 6.0 doubles 5.0's 64 GT/s line rate (128 GB/s per direction raw); 100 GB/s achievable is 5.0's ratio, unmeasured"},
	"pcie6-pageable": {Name: "pcie6-pageable", DescriptorCost: descriptorCost, EventCost: eventCost, BandwidthBytesPerS: pageableH2D, Latency: 10 * time.Microsecond,
		Source: "bounded by the CPU staging copy, not the link: the H200's measured pageable figure, as pcie5-pageable"},
	"nvlink-c2c-gh200": {Name: "nvlink-c2c-gh200", DescriptorCost: descriptorCost, EventCost: eventCost, BandwidthBytesPerS: 450 * gb, Latency: 2 * time.Microsecond,
		Source: "seed chapter: NVLink-C2C Grace to Hopper 450 GB/s (900 GB/s both directions, datasheet)"},
	"nvlink-c2c-gb200": {Name: "nvlink-c2c-gb200", DescriptorCost: descriptorCost, EventCost: eventCost, BandwidthBytesPerS: 450 * gb, Latency: 2 * time.Microsecond,
		Source: "GB200 datasheet: NVLink-C2C 900 GB/s bidirectional (450 each way) from Grace, shared by the superchip's two B200s; this preset gives one GPU all of it"},
	"nvme-gen4": {Name: "nvme-gen4", BandwidthBytesPerS: 6.5 * gb, Latency: 80 * time.Microsecond,
		Source: "one PCIe 4.0 x4 NVMe drive: 7 GB/s sequential read on datasheets, 6.5 achievable with O_DIRECT; ~80 us read latency"},
	"nvme-gen5": {Name: "nvme-gen5", BandwidthBytesPerS: 13 * gb, Latency: 70 * time.Microsecond,
		Source: "one PCIe 5.0 x4 NVMe drive: 14 GB/s sequential read on datasheets, 13 achievable; ~70 us read latency"},
	"rdma-400g": {Name: "rdma-400g", BandwidthBytesPerS: 45 * gb, Latency: 5 * time.Microsecond,
		Source: "seed chapter: 400 Gb/s NIC reading from a remote host by GPUDirect RDMA, 45 GB/s"},
}

// LinkNames lists the link presets, sorted.
func LinkNames() []string { return sortedKeys(linkPresets) }

// LookupLink returns a copy of the named preset (case-insensitive); NAME-xN
// is N striped drives of NAME.
func LookupLink(name string) (Link, error) {
	lower := strings.ToLower(name)
	if l, ok := linkPresets[lower]; ok {
		return l, nil
	}
	if i := strings.LastIndex(lower, "-x"); i > 0 {
		var n int
		if _, err := fmt.Sscanf(lower[i+2:], "%d", &n); err == nil && fmt.Sprint(n) == lower[i+2:] {
			if l, ok := linkPresets[lower[:i]]; ok {
				return l.Drives(n)
			}
		}
	}
	return Link{}, fmt.Errorf("link %q: %w; known: %s (and NAME-xN for N striped drives)", name, ErrUnknownName, strings.Join(LinkNames(), ", "))
}

// Path is how a tier's bytes reach the GPU: over its Ingress, after a
// Source hop (an NVMe drive, a NIC) or not, encoded by Codec or not.
// Latency, StreamTime and TransferTime are the links' times for bytes as
// they travel (encoded, when the tier compresses); a load's time with its
// decode is Scenario.ReloadTime's or the Planner's.
type Path struct {
	Source    Link // zero when the data starts in host memory
	Ingress   Link // the GPU's own link (PCIe, NVLink-C2C)
	Pipelined bool // the hops overlap, the slower one sets the rate
	// Codec is how the tier holds blocks (zero: as the GPU holds them,
	// LookupCodec("fp8-e4m3"): half the bytes cross the links).
	Codec Codec
}

// DirectPath is a path of one link.
func DirectPath(l Link) Path { return Path{Ingress: l, Pipelined: true} }

// HasSource reports whether the path has two hops.
func (p *Path) HasSource() bool { return p.Source.BandwidthBytesPerS > 0 }

// Validate checks both hops; an error names the hop.
func (p *Path) Validate() error {
	if err := p.Ingress.Validate(); err != nil {
		return fmt.Errorf("link %s: %w", p.Ingress.Name, err)
	}
	if p.HasSource() || p.Source.Name != "" {
		if err := p.Source.Validate(); err != nil {
			return fmt.Errorf("link %s: %w", p.Source.Name, err)
		}
	}
	return p.Codec.Validate()
}

// Name is "source | ingress" (pipelined), "source then ingress" or the
// ingress's name, followed by " (codec)" when the tier compresses.
func (p *Path) Name() string {
	name := p.Ingress.Name
	if p.HasSource() {
		sep := " then "
		if p.Pipelined {
			sep = " | "
		}
		name = p.Source.Name + sep + p.Ingress.Name
	}
	if p.Codec.Enabled() {
		name += " (" + p.Codec.Name + ")"
	}
	return name
}

// latencySeconds is paid once per transfer: both hops' latencies.
func (p *Path) latencySeconds() float64 {
	s := p.Ingress.Latency.Seconds()
	if p.HasSource() {
		s += p.Source.Latency.Seconds()
	}
	return s
}

// secondsPerByte is the path's steady-state cost of one byte: the slower
// hop's when pipelined, both hops' in a row when not.
func (p *Path) secondsPerByte() float64 {
	in := 1 / p.Ingress.BandwidthBytesPerS
	if !p.HasSource() {
		return in
	}
	src := 1 / p.Source.BandwidthBytesPerS
	if p.Pipelined {
		return math.Max(src, in)
	}
	return src + in
}

// Latency is both hops' latencies, paid once per transfer.
func (p *Path) Latency() time.Duration { return seconds(p.latencySeconds()) }

// StreamTime is bytes' time on the path in a stream of copies: no latency.
func (p *Path) StreamTime(bytes int64) time.Duration {
	return seconds(float64(bytes) * p.secondsPerByte())
}

// TransferTime moves bytes as one transfer; 0 bytes cost nothing.
func (p *Path) TransferTime(bytes int64) time.Duration {
	if bytes <= 0 {
		return 0
	}
	return seconds(p.latencySeconds() + float64(bytes)*p.secondsPerByte())
}

// seconds converts float64 seconds to a Duration, rounding to the nearest
// nanosecond and saturating instead of overflowing.
func seconds(s float64) time.Duration {
	ns := math.Round(s * 1e9)
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}
