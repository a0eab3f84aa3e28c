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

// cuModule is a module loaded by LoadModule.
type cuModule struct {
	d    *drvDevice
	name string
	mu   sync.RWMutex // Launch holds it for reading; Unload for writing
	m    C.drvCUmodule
}

// cuFunction is a kernel of a cuModule.
type cuFunction struct {
	mod  *cuModule
	name string
	f    C.drvCUfunction
}

func (f *cuFunction) Name() string { return f.name }

var (
	_ ModuleLoader = (*drvDevice)(nil)
	_ Launcher     = (*cuStream)(nil)
)

func (d *drvDevice) LoadModule(name, ptx string) (Module, error) {
	if err := d.usable("LoadModule"); err != nil {
		return nil, err
	}
	if len(ptx) == 0 {
		return nil, fmt.Errorf("cudastream: LoadModule %s: %w: the PTX is empty", name, ErrInvalidValue)
	}
	cptx := C.CString(ptx)
	defer C.free(unsafe.Pointer(cptx))
	var m C.drvCUmodule
	if rc := C.drvModuleLoad(d.t, cptx, &m); rc != 0 {
		err := d.err(fmt.Sprintf("cuModuleLoadData (%s)", name), rc)
		if rc == 218 || rc == 222 { // CUDA_ERROR_INVALID_PTX, CUDA_ERROR_UNSUPPORTED_PTX_VERSION
			err = fmt.Errorf("%w: %w", ErrNotSupported, err)
		}
		return nil, fmt.Errorf("cudastream: LoadModule: %w", err)
	}
	return &cuModule{d: d, name: name, m: m}, nil
}

func (m *cuModule) Function(name string) (Function, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.m == nil {
		return nil, fmt.Errorf("cudastream: Module %s: Function %s: %w: the module is unloaded", m.name, name, ErrInvalidValue)
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var f C.drvCUfunction
	if rc := C.drvModuleFunction(m.d.t, m.m, cname, &f); rc != 0 {
		return nil, fmt.Errorf("cudastream: Module %s: %w", m.name, m.d.err(fmt.Sprintf("cuModuleGetFunction (%s)", name), rc))
	}
	return &cuFunction{mod: m, name: name, f: f}, nil
}

func (m *cuModule) Unload() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		return nil
	}
	rc := C.drvModuleUnload(m.d.t, m.m)
	m.m = nil
	return m.d.err(fmt.Sprintf("cuModuleUnload (%s)", m.name), rc)
}

func (s *cuStream) Launch(f Function, cfg LaunchConfig, args []uint64) error {
	name := "<nil>"
	if f != nil {
		name = f.Name()
	}
	if err := checkLaunch(name, cfg, args); err != nil {
		return err
	}
	fn, ok := f.(*cuFunction)
	if !ok || fn.mod.d != s.d {
		return fmt.Errorf("cudastream: Launch %s: %w: the function is not from a module loaded on this stream's device", name, ErrInvalidValue)
	}
	fn.mod.mu.RLock()
	defer fn.mod.mu.RUnlock()
	if fn.mod.m == nil {
		return fmt.Errorf("cudastream: Launch %s: %w: its module %s is unloaded", name, ErrInvalidValue, fn.mod.name)
	}
	if err := s.lock("Launch"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	var argp *C.ulonglong
	if len(args) > 0 {
		argp = (*C.ulonglong)(unsafe.Pointer(&args[0]))
	}
	rc := C.drvLaunch(s.d.t, s.s, fn.f, (*C.uint)(unsafe.Pointer(&cfg.Grid[0])), (*C.uint)(unsafe.Pointer(&cfg.Block[0])),
		C.uint(cfg.SharedBytes), argp, C.uint(len(args)))
	return s.d.err(fmt.Sprintf("cuLaunchKernel (%s)", name), rc)
}
