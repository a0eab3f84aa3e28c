package main

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"kvtier.dev/kvtier/pinned"
)

// serial is the recipe before any parallelism: mmap, touch every page on
// one thread, then register chunk after chunk. It returns the total time and
// each stage's. Memory is unregistered and unmapped before it returns.
func serial(size, chunkBytes int64, reg pinned.Registrar) (total, touch, register time.Duration, err error) {
	t0 := time.Now()
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	defer func() { err = errors.Join(err, unix.Munmap(mem)) }()
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 0
	}
	t1 := time.Now()
	var done int64
	defer func() {
		for off := int64(0); off < done; off += chunkBytes {
			err = errors.Join(err, reg.HostUnregister(mem[off:min(off+chunkBytes, done)]))
		}
	}()
	for off := int64(0); off < size; off += chunkBytes {
		end := min(off+chunkBytes, size)
		if err := reg.HostRegister(mem[off:end]); err != nil {
			return 0, 0, 0, fmt.Errorf("registering %d bytes at offset %d: %w", end-off, off, err)
		}
		done = end
	}
	t2 := time.Now()
	return t2.Sub(t0), t1.Sub(t0), t2.Sub(t1), nil
}
