package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	r, err := pinned.Alloc(ctx, size, pinned.Options{Registrar: dev, Pages: pages})
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, r.Close()) }()
	ha, err := dev.HostAlloc(size)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, dev.HostFree(ha)) }()
	dptr, err := dev.Alloc(size)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, dev.Free(dptr)) }()
	st, err := dev.NewStream(0)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, st.Destroy()) }()

	// Correctness over the first 256 MiB (or all of a smaller region), which
	// lies in the first chunk.
	n := min(size, 256<<20, r.ChunkBytes())
	reg := r.Bytes()
	for i := range reg[:n] {
		reg[i] = byte(i*7 + i>>12)
	}
	clear(ha[:n])
	if err := st.CopyHtoD(dptr, reg[:n]); err != nil {
		return res, err
	}
	if err := st.CopyDtoH(ha[:n], dptr); err != nil {
		return res, err
	}
	if err := st.Synchronize(); err != nil {
		return res, err
	}
	if !bytes.Equal(ha[:n], reg[:n]) {
		return res, fmt.Errorf("copy check: data sent from the pinned region came back different")
	}
	want := bytes.Clone(reg[:n])
	clear(reg[:n])
	if err := st.CopyDtoH(reg[:n], dptr); err != nil {
		return res, err
	}
	if err := st.Synchronize(); err != nil {
		return res, err
	}
	if !bytes.Equal(reg[:n], want) {
		return res, fmt.Errorf("copy check: data copied into the pinned region is wrong")
	}

	// The region is registered chunk by chunk, and the driver refuses a copy
	// spanning two registrations: copy it chunk by chunk.
	cb := r.ChunkBytes()
	toRegion := func() error {
		for off := int64(0); off < size; off += cb {
			end := min(off+cb, size)
			if err := st.CopyDtoH(reg[off:end], dptr+cudastream.DevicePtr(off)); err != nil {
				return err
			}
		}
		return nil
	}
	fromRegion := func() error {
		for off := int64(0); off < size; off += cb {
			end := min(off+cb, size)
			if err := st.CopyHtoD(dptr+cudastream.DevicePtr(off), reg[off:end]); err != nil {
				return err
			}
		}
		return nil
	}
	timed := func(fn func() error) (float64, error) {
		t0 := time.Now()
		if err := fn(); err != nil {
			return 0, err
		}
		if err := st.Synchronize(); err != nil {
			return 0, err
		}
		return rate(size, time.Since(t0)), nil
	}
	for i := 0; i < runs; i++ { // alternate which memory goes first
		steps := []struct {
			into *[]float64
			fn   func() error
		}{
			{&res.dtohHostAlloc, func() error { return st.CopyDtoH(ha, dptr) }},
			{&res.dtohPinned, toRegion},
			{&res.htodHostAlloc, func() error { return st.CopyHtoD(dptr, ha) }},
			{&res.htodPinned, fromRegion},
		}
		if i%2 == 1 {
			steps[0], steps[1], steps[2], steps[3] = steps[1], steps[0], steps[3], steps[2]
		}
		for _, s := range steps {
			v, err := timed(s.fn)
			if err != nil {
				return res, err
			}
			*s.into = append(*s.into, v)
		}
	}
	return res, nil
}
