package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/pinned"
)

// copyResult is what copyCheck measured.
type copyResult struct {
	dtohHostAlloc, dtohPinned []float64 // GiB/s per run
	htodHostAlloc, htodPinned []float64
}

// copyCheck proves the copy engine really reads and writes a region made by
// pinned.Alloc: data sent from the region to the device comes back through
// cuMemHostAlloc memory unchanged, data sent back lands in the region, and
// copies of size bytes run at the speed they run to and from cuMemHostAlloc
// memory (the bar: within 10%).
func copyCheck(ctx context.Context, dev cudastream.Device, size int64, runs int, pages pinned.PageMode) (res copyResult, err error) {
	c, err := openCopyBench(ctx, dev, size, pages)
	if err != nil {
		return res, err
	}
	defer func() { err = c.close(err) }()
	if err := c.checkData(); err != nil {
		return res, err
	}
	return c.timeRuns(runs)
}

// copyBench is what copyCheck copies between: a region made by
// pinned.Alloc, cuMemHostAlloc memory and device memory, size bytes each,
// and a stream.
type copyBench struct {
	dev  cudastream.Device
	size int64
	r    *pinned.Region
	reg  []byte // r's bytes
	ha   []byte // cuMemHostAlloc memory
	dptr cudastream.DevicePtr
	st   cudastream.Stream
	undo []func() error // frees what open made, in the order it made it
}

// openCopyBench allocates the memories and the stream. The caller MUST
// close it; on an error it has freed what it made.
func openCopyBench(ctx context.Context, dev cudastream.Device, size int64, pages pinned.PageMode) (*copyBench, error) {
	c := &copyBench{dev: dev, size: size}
	if err := c.open(ctx, pages); err != nil {
		return nil, c.close(err)
	}
	return c, nil
}

func (c *copyBench) open(ctx context.Context, pages pinned.PageMode) error {
	r, err := pinned.Alloc(ctx, c.size, pinned.Options{Registrar: c.dev, Pages: pages})
	if err != nil {
		return err
	}
	c.r, c.reg = r, r.Bytes()
	c.undo = append(c.undo, r.Close)
	ha, err := c.dev.HostAlloc(c.size)
	if err != nil {
		return err
	}
	c.ha = ha
	c.undo = append(c.undo, func() error { return c.dev.HostFree(ha) })
	dptr, err := c.dev.Alloc(c.size)
	if err != nil {
		return err
	}
	c.dptr = dptr
	c.undo = append(c.undo, func() error { return c.dev.Free(dptr) })
	if c.st, err = c.dev.NewStream(0); err != nil {
		return err
	}
	c.undo = append(c.undo, c.st.Destroy)
	return nil
}

// close frees what open made, last made first, joining each one's error
// to err.
func (c *copyBench) close(err error) error {
	for _, free := range slices.Backward(c.undo) {
		err = errors.Join(err, free())
	}
	c.undo = nil
	return err
}

// checkData sends data from the region to the device and back through
// cuMemHostAlloc memory, then from the device into the region, and checks
// that it arrives unchanged both ways. It uses the first 256 MiB (or all
// of a smaller region), which lies in the first chunk.
func (c *copyBench) checkData() error {
	n := min(c.size, 256<<20, c.r.ChunkBytes())
	reg, ha, st := c.reg[:n], c.ha[:n], c.st
	for i := range reg {
		reg[i] = byte(i*7 + i>>12)
	}
	clear(ha)
	if err := st.CopyHtoD(c.dptr, reg); err != nil {
		return err
	}
	if err := st.CopyDtoH(ha, c.dptr); err != nil {
		return err
	}
	if err := st.Synchronize(); err != nil {
		return err
	}
	if !bytes.Equal(ha, reg) {
		return fmt.Errorf("copy check: data sent from the pinned region came back different")
	}
	want := bytes.Clone(reg)
	clear(reg)
	if err := st.CopyDtoH(reg, c.dptr); err != nil {
		return err
	}
	if err := st.Synchronize(); err != nil {
		return err
	}
	if !bytes.Equal(reg, want) {
		return fmt.Errorf("copy check: data copied into the pinned region is wrong")
	}
	return nil
}

// timeRuns times runs copies of size bytes each way, into and out of the
// region and of cuMemHostAlloc memory, alternating which memory goes
// first. On an error it returns the rates it has.
func (c *copyBench) timeRuns(runs int) (res copyResult, err error) {
	for i := 0; i < runs; i++ {
		steps := []struct {
			into *[]float64
			fn   func() error
		}{
			{&res.dtohHostAlloc, func() error { return c.st.CopyDtoH(c.ha, c.dptr) }},
			{&res.dtohPinned, c.toRegion},
			{&res.htodHostAlloc, func() error { return c.st.CopyHtoD(c.dptr, c.ha) }},
			{&res.htodPinned, c.fromRegion},
		}
		if i%2 == 1 {
			steps[0], steps[1], steps[2], steps[3] = steps[1], steps[0], steps[3], steps[2]
		}
		for _, s := range steps {
			v, err := c.timed(s.fn)
			if err != nil {
				return res, err
			}
			*s.into = append(*s.into, v)
		}
	}
	return res, nil
}

// timed runs fn's copies and waits for them; it returns their GiB/s.
func (c *copyBench) timed(fn func() error) (float64, error) {
	t0 := time.Now()
	if err := fn(); err != nil {
		return 0, err
	}
	if err := c.st.Synchronize(); err != nil {
		return 0, err
	}
	return rate(c.size, time.Since(t0)), nil
}

// toRegion copies the device memory into the region. The region is
// registered chunk by chunk, and the driver refuses a copy spanning two
// registrations: it copies chunk by chunk.
func (c *copyBench) toRegion() error {
	cb := c.r.ChunkBytes()
	for off := int64(0); off < c.size; off += cb {
		end := min(off+cb, c.size)
		if err := c.st.CopyDtoH(c.reg[off:end], c.dptr+cudastream.DevicePtr(off)); err != nil {
			return err
		}
	}
	return nil
}

// fromRegion copies the region into the device memory, chunk by chunk.
func (c *copyBench) fromRegion() error {
	cb := c.r.ChunkBytes()
	for off := int64(0); off < c.size; off += cb {
		end := min(off+cb, c.size)
		if err := c.st.CopyHtoD(c.dptr+cudastream.DevicePtr(off), c.reg[off:end]); err != nil {
			return err
		}
	}
	return nil
}
