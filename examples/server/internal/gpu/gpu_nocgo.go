//go:build !cgo

package gpu

import (
	"fmt"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/model"
)

// Model is unavailable without cgo.
type Model struct{}

// New reports that there is no GPU without cgo.
func New(c model.Config, seed uint64, region cudastream.DevicePtr, numSlots int, o Options) (*Model, error) {
	return nil, fmt.Errorf("gpu: built without cgo: %w", cudastream.ErrNoDriver)
}

// Forward is unreachable: New never returns a Model.
func (m *Model) Forward(tokens []int32, p model.Plan) ([]float32, int32, error) {
	return nil, 0, fmt.Errorf("gpu: built without cgo: %w", cudastream.ErrNoDriver)
}

// WarmUp is unreachable: New never returns a Model.
func (m *Model) WarmUp(slots []int32) (int, error) {
	return 0, fmt.Errorf("gpu: built without cgo: %w", cudastream.ErrNoDriver)
}

// Close does nothing.
func (m *Model) Close() error { return nil }

// Library names the cuBLAS library in use.
func (m *Model) Library() string { return "" }

// AttentionKernel names no kernel without cgo.
func (m *Model) AttentionKernel() string { return "" }

// Stages reports nothing without cgo.
func (m *Model) Stages() []StageTime { return nil }

// SetStageTimes does nothing without cgo.
func (m *Model) SetStageTimes(on bool) {}

// Attention is unreachable: New never returns a Model.
func (m *Model) Attention() Attention { return AttentionMMA }

// ComputeCapability is unreachable: New never returns a Model.
func (m *Model) ComputeCapability() (major, minor int) { return 0, 0 }

// AttentionRows is unreachable: New never returns a Model.
func (m *Model) AttentionRows() int { return 64 }
