//go:build cgo

package cudastream

/*
#include <stdlib.h>
#include "cuda_driver.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// drvSum is a device's word-sum module, loaded once at first use.
type drvSum struct {
	once sync.Once
	err  error
}

func (d *drvDevice) loadSum() error {
	k := &d.sum
	k.once.Do(func() {
		ptx := C.CString(sumPTX)
		defer C.free(unsafe.Pointer(ptx))
		var step C.int
		if rc := C.drvLoadSumModule(d.t, ptx, &step); rc != 0 {
			call := "cuModuleLoadData (kernels/sum.ptx)"
			if step == 3 {
				call = "cuModuleGetFunction (kvtier_wordsum)"
			}
			// A driver older than the PTX (ISA 9.0, CUDA 13.0) cannot JIT
			// it: the device cannot sum, and callers fall back.
			k.err = fmt.Errorf("cudastream: loading the word-sum kernel: %w: %w", ErrNotSupported, d.err(call, rc))
		}
	})
	return k.err
}

var _ WordSummer = (*cuStream)(nil)

func (s *cuStream) WordSums(l SumLayout, blocks []int32, partials DevicePtr) error {
	if err := checkWordSums(l, blocks, partials); err != nil {
		return err
	}
	if len(blocks) == 0 {
		return nil
	}
	if err := s.d.loadSum(); err != nil {
		return err
	}
	if err := s.lock("WordSums"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	per := uint64(l.PartialsPerBlock()) * 8
	for start := 0; start < len(blocks); start += maxSumBlocks {
		g := blocks[start:min(start+maxSumBlocks, len(blocks))]
		rc := C.drvLaunchWordSum(s.d.t, s.s, C.drvCUdeviceptr(l.Bases), C.uint(l.Pieces),
			C.ulonglong(l.PieceBytes/8), C.ulonglong(l.BlockStride), (*C.int)(unsafe.Pointer(&g[0])), C.uint(len(g)),
			C.ulonglong(SumChunkBytes/8), C.uint(l.chunks()), sumThreads, C.drvCUdeviceptr(uint64(partials)+uint64(start)*per))
		if rc != 0 {
			return fmt.Errorf("cudastream: WordSums of blocks %d..%d of %d: %w", start, start+len(g)-1, len(blocks), s.d.err("cuLaunchKernel (kvtier_wordsum)", rc))
		}
	}
	return nil
}
