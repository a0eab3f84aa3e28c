package cudastream_test

import (
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvtier.dev/internal/gputest"

	// The GPU tests are outside the package: export_test.go says why.
	. "kvtier.dev/cudastream"
)

// BenchmarkCuWaitCPU measures what waiting for the GPU costs the host: 32
// goroutines, each with its own stream, copy 1 MiB blocks from pinned
// memory to the device and sum them there (WordSums and the partials'
// copy back), then wait on a blocking-sync event, once per block or once
// per 8 blocks, as a transfer of that many blocks does, after one warm-up
// round each. It reports the process's CPU time (user+system) per block.
// Run on the GPU machine:
//
//	go test -c -o .gpu/cudastream.test ./cudastream
//	cd cudastream && ../.gpu/cudastream.test -test.run X -test.bench CuWaitCPU -test.benchtime 16384x
func BenchmarkCuWaitCPU(b *testing.B) {
	d := gputest.Device(b)
	const bs, workers = 1 << 20, 32
	for _, batch := range []int{1, 8} {
		b.Run(map[int]string{1: "wait-per-block", 8: "wait-per-8-blocks"}[batch], func(b *testing.B) {
			ws := make([]*waitWorker, workers)
			for i := range ws {
				ws[i] = newWaitWorker(b, d, bs, batch)
			}
			for _, w := range ws { // warm up: the module's load, the streams' first work
				w.run(b, 1)
			}
			rounds := max(1, b.N/(workers*batch))
			var wg sync.WaitGroup
			b.ResetTimer()
			c0 := processCPU()
			for _, w := range ws {
				wg.Go(func() { w.run(b, rounds) })
			}
			wg.Wait()
			used := processCPU() - c0
			b.StopTimer()
			b.ReportMetric(float64(used.Nanoseconds())/1e3/float64(rounds*workers*batch), "cpu-µs/block")
		})
	}
}

type waitWorker struct {
	st     Stream
	ev     Event
	host   []byte
	dev    DevicePtr
	l      SumLayout
	ids    []int32
	part   DevicePtr
	partH  []byte
	bs     int
	blocks int
}

func newWaitWorker(b *testing.B, d Device, bs, blocks int) *waitWorker {
	w := &waitWorker{bs: bs, blocks: blocks}
	var err error
	must := func(what string, err error) {
		if err != nil {
			b.Fatalf("%s: %v", what, err)
		}
	}
	w.st, err = d.NewStream(0)
	must("NewStream", err)
	w.ev, err = d.NewEvent(EventOptions{BlockingSync: true})
	must("NewEvent", err)
	w.host, err = d.HostAlloc(int64(bs * blocks))
	must("HostAlloc", err)
	w.dev, err = d.Alloc(int64(bs * blocks))
	must("Alloc", err)
	bases, err := d.Alloc(8)
	must("Alloc", err)
	w.l = SumLayout{Bases: bases, Pieces: 1, PieceBytes: int64(bs), BlockStride: int64(bs)}
	w.part, err = d.Alloc(int64(blocks*w.l.PartialsPerBlock()) * 8)
	must("Alloc", err)
	w.partH, err = d.HostAlloc(int64(blocks*w.l.PartialsPerBlock()) * 8)
	must("HostAlloc", err)
	for i := range blocks {
		w.ids = append(w.ids, int32(i))
	}
	addr := make([]byte, 8)
	for i := range addr {
		addr[i] = byte(uint64(w.dev) >> (8 * i))
	}
	must("CopyHtoD", w.st.CopyHtoD(bases, addr))
	must("Synchronize", w.st.Synchronize())
	b.Cleanup(func() {
		w.st.Destroy()
		w.ev.Destroy()
		d.HostFree(w.host)
		d.HostFree(w.partH)
		d.Free(w.dev)
		d.Free(bases)
		d.Free(w.part)
	})
	return w
}

func (w *waitWorker) run(b *testing.B, rounds int) {
	for range rounds {
		for k := range w.blocks {
			if err := w.st.CopyHtoD(w.dev+DevicePtr(k*w.bs), w.host[k*w.bs:(k+1)*w.bs]); err != nil {
				b.Error(err)
				return
			}
		}
		if err := w.st.(WordSummer).WordSums(w.l, w.ids, w.part); err != nil {
			b.Error(err)
			return
		}
		if err := w.st.CopyDtoH(w.partH, w.part); err != nil {
			b.Error(err)
			return
		}
		if err := w.ev.Record(w.st); err != nil {
			b.Error(err)
			return
		}
		if err := w.ev.Synchronize(); err != nil {
			b.Error(err)
			return
		}
	}
}

// processCPU is the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
