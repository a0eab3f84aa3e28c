package transfer

import (
	"fmt"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/codec/cudacodec"
)

// CodecKernel is one launch of the codec path's kernels, timed on the
// device (Config.OnCodecKernel).
type CodecKernel struct {
	// Encode: a quantize, leaving the GPU; false: a dequantize, arriving.
	Encode bool
	// Blocks is how many blocks the launch coded; RawBytes their bytes as
	// the GPU holds them (of the layers it wrote, for a dequantize of a
	// group of layers).
	Blocks   int
	RawBytes int64
	// Elapsed is the device's time between events recorded on the
	// kernels' stream just before the launch and just after it: the
	// kernel's run, sharing the GPU with whatever else ran meanwhile.
	Elapsed time.Duration
}

// codecTimers is how many launches a direction has in flight being timed:
// one per coded transfer (its first chunk's), while a pair of events is
// free; a transfer that finds none goes untimed.
const codecTimers = 4

// kernelTimer is a pair of timing events and the launch they time.
type kernelTimer struct {
	start, end cudastream.Event
	k          CodecKernel
}

// newKernelTimers makes the ring's timers (Config.OnCodecKernel).
func (r *codecRing) newKernelTimers(dev cudastream.Device) error {
	r.free = make(chan *kernelTimer, codecTimers)
	for range codecTimers {
		tm := &kernelTimer{}
		var err error
		if tm.start, err = dev.NewEvent(cudastream.EventOptions{Timing: true}); err != nil {
			return fmt.Errorf("transfer: codec timing event: %w", err)
		}
		if tm.end, err = dev.NewEvent(cudastream.EventOptions{Timing: true}); err != nil {
			tm.start.Destroy()
			return fmt.Errorf("transfer: codec timing event: %w", err)
		}
		r.timers = append(r.timers, tm)
		r.free <- tm
	}
	return nil
}

// timed wraps launch, a kernel on r's stream, in a free timer's events
// when t has none yet, and gives t the timer; otherwise it returns launch.
func (r *codecRing) timed(t *Transfer, cs *codecState, encode bool, blocks int, lr cudacodec.Layers, launch func() error) func() error {
	if r.free == nil || t.timer != nil {
		return launch
	}
	var tm *kernelTimer
	select {
	case tm = <-r.free:
	default:
		return launch
	}
	raw := int64(blocks) * cs.raw
	if !encode {
		raw = raw / int64(cs.shape.Layers) * int64(lr.Count)
	}
	tm.k = CodecKernel{Encode: encode, Blocks: blocks, RawBytes: raw}
	t.timer, t.timerRing = tm, r
	return func() error {
		if err := tm.start.Record(r.kernel); err != nil {
			return fmt.Errorf("record the timing event: %w", err)
		}
		if err := launch(); err != nil {
			return err
		}
		if err := tm.end.Record(r.kernel); err != nil {
			return fmt.Errorf("record the timing event: %w", err)
		}
		return nil
	}
}

// reportKernel gives t's timer back, and tells onKernel of the launch it
// timed when t succeeded and the device says how long it took. Called
// once t is done, so the launch has completed.
func (t *Transfer) reportKernel(onKernel func(CodecKernel)) {
	tm, r := t.timer, t.timerRing
	if tm == nil {
		return
	}
	t.timer, t.timerRing = nil, nil
	if t.err == nil && onKernel != nil {
		if d, err := tm.end.Elapsed(tm.start); err == nil && d > 0 {
			tm.k.Elapsed = d
			onKernel(tm.k)
		}
	}
	r.free <- tm // never blocks: the channel holds every timer
}

// destroyTimers releases the ring's timers' events.
func (r *codecRing) destroyTimers() []error {
	var errs []error
	for _, tm := range r.timers {
		errs = append(errs, tm.start.Destroy(), tm.end.Destroy())
	}
	r.timers = nil
	return errs
}
