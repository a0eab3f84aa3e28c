// Package roundtrip sends KV blocks from a GPU region through kvtier's lower
// tiers and back, with kvtier's own machinery: the copy engine
// (kvtier/transfer) offloads them to a pinned host pool, the NVMe store
// (kvtier/nvme) writes those slots to disk and reads them into other host
// slots, and the engine onboards those into other GPU slots. The model's
// tests use it to show that reused KV is bit-exact after the trip, on the
// simulated device in CI and on a real GPU.
package roundtrip

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/transfer"
)

// Trip is what Blocks saw on the way.
type Trip struct {
	// Host[i] is block i's bytes in its pinned host slot after the offload;
	// NVMe[i] its bytes read back from the store. Both are copies.
	Host, NVMe [][]byte
}

// Blocks moves the blocks in GPU slots src through the host tier and the
// NVMe tier (a store in dir) into GPU slots dst of the same region, a
// block-first layout of gpu. It returns when the last copy has completed.
// src and dst MUST have the same length and dst MUST NOT overlap src.
func Blocks(ctx context.Context, dev cudastream.Device, gpu transfer.GPULayout, dir string, src, dst []int32) (Trip, error) {
	if len(src) != len(dst) || len(src) == 0 {
		return Trip{}, fmt.Errorf("roundtrip: %d source and %d destination blocks", len(src), len(dst))
	}
	n := len(src)
	blockBytes := gpu.BlockBytes()
	slotBytes := (blockBytes + 4095) &^ 4095
	pool, err := unix.Mmap(-1, 0, int(2*int64(n)*slotBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return Trip{}, fmt.Errorf("roundtrip: map the host pool: %w", err)
	}
	defer unix.Munmap(pool)
	if err := dev.HostRegister(pool); err != nil {
		return Trip{}, fmt.Errorf("roundtrip: register the host pool: %w", err)
	}
	defer dev.HostUnregister(pool)
	host := transfer.HostLayout{Pool: pool, SlotBytes: slotBytes}
	eng, err := transfer.New(dev, transfer.Config{GPU: gpu, Host: host})
	if err != nil {
		return Trip{}, fmt.Errorf("roundtrip: %w", err)
	}
	defer eng.Close()
	store, err := nvme.Open(nvme.Config{Dirs: []string{dir}, SlotsPerFile: n, BlockBytes: int(blockBytes)})
	if err != nil {
		return Trip{}, fmt.Errorf("roundtrip: %w", err)
	}
	defer store.Close()

	var trip Trip
	out, in := make([]transfer.Pair, n), make([]transfer.Pair, n)
	for i := range n {
		out[i] = transfer.Pair{GPUBlock: src[i], HostSlot: int32(i)}
		in[i] = transfer.Pair{GPUBlock: dst[i], HostSlot: int32(n + i)}
	}
	if err := wait(eng.Offload(ctx, out, nil)); err != nil {
		return Trip{}, fmt.Errorf("roundtrip: offload: %w", err)
	}
	for i := range n {
		b := host.Slot(int32(i))[:blockBytes]
		trip.Host = append(trip.Host, append([]byte(nil), b...))
		slot, err := store.Allocate()
		if err != nil {
			return Trip{}, fmt.Errorf("roundtrip: %w", err)
		}
		if err := store.Write(ctx, slot, nvme.BlockMeta{Key: uint64(i + 1), Position: uint32(i)}, b); err != nil {
			return Trip{}, fmt.Errorf("roundtrip: write block %d: %w", i, err)
		}
		back := host.Slot(int32(n + i))
		if _, err := store.Read(ctx, slot, back); err != nil {
			return Trip{}, fmt.Errorf("roundtrip: read block %d: %w", i, err)
		}
		trip.NVMe = append(trip.NVMe, append([]byte(nil), back[:blockBytes]...))
	}
	if err := wait(eng.Onboard(ctx, in)); err != nil {
		return Trip{}, fmt.Errorf("roundtrip: onboard: %w", err)
	}
	return trip, nil
}

// wait waits until t is done (its memory is free again even if it failed).
func wait(t *transfer.Transfer, err error) error {
	if err != nil {
		return err
	}
	defer t.Release()
	<-t.Done()
	return t.Err()
}
