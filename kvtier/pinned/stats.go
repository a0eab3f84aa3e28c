package pinned

import "time"

// Stats describes how a region was made: what was asked, what was used, and
// how long each stage took.
type Stats struct {
	SizeBytes  int64
	ChunkBytes int64
	Chunks     int

	PageModeAsked PageMode
	PageMode      PageMode // what backs the region (after any fallback)
	PageNote      string   // why PageMode differs from what was asked, THP's sysfs setting

	Fault       FaultMethod
	Touchers    int
	TouchCPUs   []int
	RegisterCPU int
	CPUNote     string // how the CPUs were chosen

	VMANames bool   // per-chunk VMAs named with PR_SET_VMA_ANON_NAME
	VMANote  string // why not, when not

	NUMABound bool
	NUMANodes []int // nodes the chunks were bound to, round robin
	NUMANote  string

	// MapTime covers mmap, madvise, VMA naming and mbind.
	MapTime time.Duration
	// TouchTime runs from the pipeline's start to the last page faulted.
	TouchTime time.Duration
	// RegisterBusyTime sums the HostRegister calls; RegisterWaitTime is
	// what the registering goroutine spent waiting for touchers.
	RegisterBusyTime time.Duration
	RegisterWaitTime time.Duration
	// TotalTime runs from Alloc's call to the last chunk registered.
	TotalTime time.Duration

	FaultedBytes    int64
	RegisteredBytes int64
}

func gibPerSec(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / float64(GiB) / d.Seconds()
}

// TouchGiBPerSec is the faulting stage's rate.
func (s Stats) TouchGiBPerSec() float64 { return gibPerSec(s.FaultedBytes, s.TouchTime) }

// RegisterGiBPerSec is the registration stage's own rate (bytes over the
// time spent inside HostRegister).
func (s Stats) RegisterGiBPerSec() float64 { return gibPerSec(s.RegisteredBytes, s.RegisterBusyTime) }

// TotalGiBPerSec is the end-to-end rate, the figure that counts.
func (s Stats) TotalGiBPerSec() float64 { return gibPerSec(s.RegisteredBytes, s.TotalTime) }

// Bound names the slower stage: "touch" or "register".
func (s Stats) Bound() string {
	if s.TouchGiBPerSec() < s.RegisterGiBPerSec() {
		return "touch"
	}
	return "register"
}
