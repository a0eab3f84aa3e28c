package transfer

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/checksum"
	"kvtier.dev/internal/gputest"
)

// The GPU tests' shape: 512 blocks of 8 layers of K and V, 16 KiB each
// (256 KiB a block), and a pinned pool of 128 slots.
const (
	gpuLayers, gpuParts, gpuPart = 8, 2, 16 << 10
	gpuBlocks, gpuSlots          = 512, 128
	gpuBlockBytes                = gpuLayers * gpuParts * gpuPart
)

// openGPU opens GPU 0 with a KV region and a pinned pool of the tests'
// shape, freed when the test ends. It skips without a driver, unless
// KVTIER_REQUIRE_GPU=1 says a GPU must be there.
func openGPU(t *testing.T) (cudastream.Device, cudastream.DevicePtr, HostLayout) {
	t.Helper()
	dev := gputest.Device(t)
	region, err := dev.Alloc(gpuBlocks * gpuBlockBytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Free(region) })
	pool := gputest.HostAlloc(t, dev, gpuSlots*gpuBlockBytes)
	return dev, region, HostLayout{Pool: pool, SlotBytes: gpuBlockBytes}
}

// gpuRoundTripPairs fills the first half of host's slots with random bytes
// and clears the rest, and returns the pairs of a round trip: slot i in to
// a random GPU block, and that block out to slot half+i.
func gpuRoundTripPairs(rng *rand.Rand, host HostLayout) (in, out []Pair) {
	half := host.Slots() / 2
	for i := range host.Pool[:int64(half)*host.SlotBytes] {
		host.Pool[i] = byte(rng.Uint32())
	}
	clear(host.Pool[int64(half)*host.SlotBytes:])
	in, out = make([]Pair, half), make([]Pair, half)
	for i, b := range rng.Perm(gpuBlocks)[:half] {
		in[i] = Pair{GPUBlock: int32(b), HostSlot: int32(i)}
		out[i] = Pair{GPUBlock: int32(b), HostSlot: int32(half + i)}
	}
	return in, out
}

// checkCameBack fails t unless each out slot holds what its in slot held.
func checkCameBack(t *testing.T, host HostLayout, in, out []Pair) {
	t.Helper()
	for i := range in {
		if !bytes.Equal(host.Slot(in[i].HostSlot), host.Slot(out[i].HostSlot)) {
			t.Fatalf("slot %d came back different from GPU block %d", in[i].HostSlot, in[i].GPUBlock)
		}
	}
}

// TestGPURoundTrip runs the engine on the real device: random data from the
// pinned pool to scattered GPU blocks and back into other slots, compared
// byte for byte, by every method (the gather/scatter path through a small
// device staging ring among them) and for both GPU layouts; the offloads'
// word sums (Config.Sums) are checksum.WordSum's of what came back. It skips without
// a driver, unless KVTIER_REQUIRE_GPU=1 says a GPU must be there. Build it
// here and run it on the GPU machine:
//
//	go test -c -o .gpu/transfer.test ./kvtier/transfer
//	KVTIER_REQUIRE_GPU=1 ./.gpu/transfer.test -test.run GPU -test.v
func TestGPURoundTrip(t *testing.T) {
	dev, region, host := openGPU(t)
	var err error
	for _, layout := range []string{"layer-first", "block-first"} {
		var g GPULayout
		if layout == "layer-first" {
			g, err = LayerFirstLayout(region, gpuLayers, gpuParts, gpuBlocks, gpuPart)
		} else {
			g, err = BlockFirstLayout(region, gpuLayers, gpuParts, gpuBlocks, gpuPart)
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []Method{MethodAuto, MethodBatch, MethodKernel, MethodLoop, MethodGather} {
			t.Run(layout+"/"+m.String(), func(t *testing.T) {
				// A ring of 3 buffers of 1.25 MiB: 64 blocks of 256 KiB
				// take 13 chunks each way, and chunks end inside blocks.
				e, err := New(dev, Config{GPU: g, Host: host, Method: m, GatherBuffers: 3, GatherBufferBytes: 5 << 18, Sums: true})
				if err != nil {
					t.Fatal(err)
				}
				defer func() {
					if err := e.Close(); err != nil {
						t.Errorf("Close: %v", err)
					}
				}()
				in, out := gpuRoundTripPairs(rand.New(rand.NewPCG(uint64(m), uint64(len(layout)))), host)
				ctx := context.Background()
				tr, err := e.Onboard(ctx, in)
				if err != nil {
					t.Fatal(err)
				}
				if err := tr.Wait(ctx); err != nil {
					t.Fatal(err)
				}
				tr.Release()
				tr, err = e.Offload(ctx, out, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := tr.Wait(ctx); err != nil {
					t.Fatal(err)
				}
				sums := append([]uint64(nil), tr.Sums()...)
				tr.Release()
				checkCameBack(t, host, in, out)
				// The offload's sums, computed by the kernel on the GPU,
				// are checksum.WordSum's of the bytes that came back.
				if len(sums) != len(out) {
					t.Fatalf("offload: %d sums for %d blocks", len(sums), len(out))
				}
				for i, sum := range sums {
					if w := checksum.WordSum(host.Slot(out[i].HostSlot)); sum != w {
						t.Fatalf("GPU block %d: the kernel's word sum %#x, checksum.WordSum %#x", out[i].GPUBlock, sum, w)
					}
				}
				st := e.Stats()
				t.Logf("%d descriptors, %d by the copy kernel; %d transfers gathered in %d chunks", st.Descriptors, st.KernelDescriptors, st.GatherTransfers, st.GatherChunks)
				if m == MethodGather && st.GatherChunks != 26 {
					t.Errorf("gather: %d chunks, want 13 each way", st.GatherChunks)
				}
			})
		}
	}
}

// TestGPUPolledRoundTrip is TestGPURoundTrip's round trip on a polled
// engine (Config.Polled), by every method: the onboard's OnDone, run inside
// Poll, submits the offload, the gather path runs on the caller's
// goroutine, and Poll, spinning on the real device's events, completes
// both. It skips without a driver, as TestGPURoundTrip does.
func TestGPUPolledRoundTrip(t *testing.T) {
	dev, region, host := openGPU(t)
	g, err := BlockFirstLayout(region, gpuLayers, gpuParts, gpuBlocks, gpuPart)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []Method{MethodAuto, MethodBatch, MethodKernel, MethodLoop, MethodGather} {
		t.Run(m.String(), func(t *testing.T) {
			e, err := New(dev, Config{GPU: g, Host: host, Method: m, GatherBuffers: 3, GatherBufferBytes: 5 << 18, Polled: true})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := e.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			in, out := gpuRoundTripPairs(rand.New(rand.NewPCG(uint64(m), 7)), host)
			ctx := context.Background()
			on, err := e.Onboard(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			var off *Transfer
			on.OnDone(func() {
				if off, err = e.Offload(ctx, out); err != nil {
					t.Error(err)
				}
			})
			deadline := time.Now().Add(10 * time.Second)
			completed := 0
			for completed < 2 && time.Now().Before(deadline) {
				completed += e.Poll()
			}
			if completed != 2 || off == nil {
				t.Fatalf("Poll completed %d transfers in 10 s, want the onboard and the offload", completed)
			}
			for _, tr := range []*Transfer{on, off} {
				if err := tr.Err(); err != nil {
					t.Fatal(err)
				}
				tr.Release()
			}
			checkCameBack(t, host, in, out)
		})
	}
}
