package cost

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// probeJSON is the part of `kvtier probe --json` the cost model reads. Other
// keys are ignored: the probe's output grows, and this reader must not break
// when it does.
type probeJSON struct {
	Device *struct {
		Name      string `json:"name"`
		PCIeGen   int    `json:"pcie_gen"`
		PCIeWidth int    `json:"pcie_width"`
	} `json:"device"`
	Measured *struct {
		H2DPinnedBytesPerS    float64 `json:"h2d_pinned_bytes_per_s"`
		D2HPinnedBytesPerS    float64 `json:"d2h_pinned_bytes_per_s"`
		H2DPageableBytesPerS  float64 `json:"h2d_pageable_bytes_per_s"`
		D2HPageableBytesPerS  float64 `json:"d2h_pageable_bytes_per_s"`
		BidirPinnedBytesPerS  float64 `json:"bidir_pinned_bytes_per_s"`
		SmallCopyBytes        float64 `json:"small_copy_bytes"`
		SmallCopyIssueSeconds float64 `json:"small_copy_issue_seconds"`
		SmallCopyBytesPerS    float64 `json:"small_copy_bytes_per_s"`
		EventRoundtripSeconds float64 `json:"event_roundtrip_seconds"`
	} `json:"measured"`
}

// Probe is a device's measured host links, from `kvtier probe --json`:
// build paths from them rather than the presets.
type Probe struct {
	DeviceName string
	PCIeGen    int
	PCIeWidth  int
	// Host-to-device links; their latency is a small copy's issue cost.
	Pinned   Link
	Pageable Link
	// D2HPinnedBytesPerS is the offload direction (0: not measured).
	D2HPinnedBytesPerS float64
}

// LoadProbe reads `kvtier probe --json`'s file, which needs the pinned
// host-to-device rate (without a pageable one, Pageable is zero). Errors
// name the file and the key.
func LoadProbe(path string) (Probe, error) {
	f, err := os.Open(path)
	if err != nil {
		return Probe{}, err
	}
	defer f.Close()
	p, err := ParseProbe(f)
	if err != nil {
		return Probe{}, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// ParseProbe is LoadProbe on a reader.
func ParseProbe(r io.Reader) (Probe, error) {
	var j probeJSON
	dec := json.NewDecoder(io.LimitReader(r, maxModelFileBytes))
	if err := dec.Decode(&j); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Probe{}, fmt.Errorf("probe: field %q: expected %v, got JSON %s", te.Field, te.Type, te.Value)
		}
		return Probe{}, fmt.Errorf("probe: %w", err)
	}
	if j.Measured == nil {
		return Probe{}, errors.New(`probe: no "measured" object (was the probe run with --json on a GPU?)`)
	}
	m := j.Measured
	var p Probe
	name := "probe"
	if j.Device != nil {
		p.DeviceName, p.PCIeGen, p.PCIeWidth = j.Device.Name, j.Device.PCIeGen, j.Device.PCIeWidth
		if p.PCIeGen > 0 {
			name = fmt.Sprintf("probe-pcie%d-x%d", p.PCIeGen, p.PCIeWidth)
		}
	}
	if m.SmallCopyIssueSeconds < 0 || m.SmallCopyIssueSeconds > maxLatencySeconds || math.IsNaN(m.SmallCopyIssueSeconds) {
		return Probe{}, fmt.Errorf("probe: %w", fieldErr("measured.small_copy_issue_seconds", m.SmallCopyIssueSeconds, "must be between 0 and %d", maxLatencySeconds))
	}
	latency := seconds(m.SmallCopyIssueSeconds)
	p.Pinned = Link{Name: name + "-pinned", BandwidthBytesPerS: m.H2DPinnedBytesPerS, Latency: latency,
		DescriptorCost: descriptorCost, EventCost: eventCost,
		Source: "measured by kvtier probe: host to device from pinned memory"}
	if err := p.Pinned.Validate(); err != nil {
		return Probe{}, fmt.Errorf("probe: measured.h2d_pinned_bytes_per_s: %w", err)
	}
	if m.H2DPageableBytesPerS != 0 {
		p.Pageable = Link{Name: name + "-pageable", BandwidthBytesPerS: m.H2DPageableBytesPerS, Latency: latency,
			DescriptorCost: descriptorCost, EventCost: eventCost,
			Source: "measured by kvtier probe: host to device from pageable memory"}
		if err := p.Pageable.Validate(); err != nil {
			return Probe{}, fmt.Errorf("probe: measured.h2d_pageable_bytes_per_s: %w", err)
		}
	}
	if m.D2HPinnedBytesPerS < 0 || m.D2HPinnedBytesPerS > maxBandwidthBytesS {
		return Probe{}, fmt.Errorf("probe: %w", fieldErr("measured.d2h_pinned_bytes_per_s", m.D2HPinnedBytesPerS, "out of range"))
	}
	p.D2HPinnedBytesPerS = m.D2HPinnedBytesPerS
	return p, nil
}
