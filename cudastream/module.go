package cudastream

import "fmt"

// ModuleLoader is an optional capability of a Device: loading a PTX module
// that a package above this one owns (its .cu source and PTX beside it),
// so that its kernels run on this device's streams (Launcher). Only the
// real device has it: the simulator runs no PTX, so a package with kernels
// keeps a Go path for it. Test for it with a type assertion.
type ModuleLoader interface {
	// LoadModule loads ptx (cuModuleLoadData; the driver JIT-compiles it
	// for the device). name is for errors only, as "kernels/fp8.ptx". A
	// driver too old for the PTX's ISA fails with ErrNotSupported. The
	// caller MUST Unload the module before it closes the device.
	LoadModule(name, ptx string) (Module, error)
}

// Module is a loaded PTX module.
type Module interface {
	// Function finds the kernel called name (extern "C", so unmangled).
	Function(name string) (Function, error)
	// Unload releases the module. Work that launched its kernels MUST have
	// completed first; later launches of its functions fail.
	Unload() error
}

// Function is a kernel of a Module, launched with a Launcher.
type Function interface {
	// Name is the kernel's name.
	Name() string
}

// Launcher is an optional capability of a Stream: launching a Function of
// a module loaded on the stream's device (cuLaunchKernel). Test for it
// with a type assertion.
type Launcher interface {
	// Launch enqueues f over cfg's grid. args[i] is the kernel's parameter
	// i, and every parameter of a kernel launched this way MUST be 8 bytes
	// wide (a pointer, long long or double: pass a pointer as
	// uint64(DevicePtr)); at most MaxLaunchArgs. The memory the kernel
	// reads or writes MUST stay valid until an event recorded after the
	// call has completed. A bad configuration, or a function of another
	// device or of an unloaded module, enqueues nothing.
	Launch(f Function, cfg LaunchConfig, args []uint64) error
}

// LaunchConfig is a launch's shape: Grid CTAs of Block threads, with
// SharedBytes of dynamic shared memory per CTA.
type LaunchConfig struct {
	Grid, Block [3]uint32
	SharedBytes uint32
}

// MaxLaunchArgs is the most parameters Launch passes (the C side's
// DRV_MAX_LAUNCH_ARGS).
const MaxLaunchArgs = 16

// checkLaunch checks what every Launch checks before it looks at f.
func checkLaunch(name string, cfg LaunchConfig, args []uint64) error {
	threads := uint64(1)
	for i := range 3 {
		if cfg.Grid[i] == 0 || cfg.Block[i] == 0 {
			return fmt.Errorf("cudastream: Launch %s: %w: LaunchConfig.Grid %v and Block %v need every dimension at least 1", name, ErrInvalidValue, cfg.Grid, cfg.Block)
		}
		threads *= uint64(cfg.Block[i])
	}
	switch {
	case threads > 1024:
		return fmt.Errorf("cudastream: Launch %s: %w: LaunchConfig.Block %v is %d threads, more than 1024", name, ErrInvalidValue, cfg.Block, threads)
	case cfg.Grid[1] > 65535 || cfg.Grid[2] > 65535:
		return fmt.Errorf("cudastream: Launch %s: %w: LaunchConfig.Grid %v: y and z must be at most 65535", name, ErrInvalidValue, cfg.Grid)
	case len(args) > MaxLaunchArgs:
		return fmt.Errorf("cudastream: Launch %s: %w: %d arguments, more than MaxLaunchArgs (%d)", name, ErrInvalidValue, len(args), MaxLaunchArgs)
	}
	return nil
}
