// Server embeds kvtier as a Go model server would: a GPU KV region, a pinned
// host pool and an NVMe store behind one block manager, with the cost planner
// deciding load or recompute and the device mover doing the copies. It then
// serves a few synthetic multi-turn conversations, checks every block it
// loads byte for byte, and prints the hits per tier and the metrics.
//
//	go run ./examples/server
//	go run ./examples/server -nvme-dir ~/.cache/kvtier-server   # twice: the second run starts warm
//
// With -nvme-dir the NVMe tier outlives the process: the next run's mover
// keeps the blocks the store recovers (DeviceMoverConfig.KeepBlocks) and the
// manager adopts them (Manager.Adopt), as a restarted server would. The
// directory must be this user's alone (the store refuses one that group or
// others may write, and creates a missing one with mode 0700), and one
// server at a time uses it. A block that fails its check when loaded is
// recomputed and counted, and cleared on disk so that the next run does not
// adopt it again.
//
// Without a CUDA driver it runs on the simulated device (with the H200's
// link model) and says so.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/pinned"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/transfer"
)

// A toy model's KV: 4 layers, K and V, 4 KiB per layer and part for a block
// of 16 tokens, so a block is 32 KiB. The tiers hold 32, 16 and 256 blocks.
const (
	layers, parts, partBytes = 4, 2, 4 << 10
	blockBytes               = layers * parts * partBytes
	blockTokens              = 16
	gpuBlocks, hostSlots     = 32, 16
	nvmeSlots                = 256
	stagingSlots, bounceSlot = 4, 4 // two staging buffers of 4 slots; 4 bounce slots
)

func main() {
	nvmeDir, err := parseArgs(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "server: %v\n", err)
		os.Exit(2)
	}
	if err := run(os.Stdout, nvmeDir); err != nil {
		log.Fatal(err)
	}
}

// parseArgs reads the flags; an argument that is not a flag is an error.
func parseArgs(args []string, stderr io.Writer) (nvmeDir string, err error) {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&nvmeDir, "nvme-dir", "", "keep the NVMe tier in this directory, only this user's (created with mode 0700 if absent), so that the next run starts warm, e.g. ~/.cache/kvtier-server (default: a temporary directory, removed at exit)")
	if err := fs.Parse(args); err != nil {
		return "", err
	}
	if fs.NArg() > 0 {
		return "", fmt.Errorf("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	return nvmeDir, nil
}

// run builds the server and serves; nvmeDir, if not empty, holds the NVMe
// tier across runs.
func run(out io.Writer, nvmeDir string) error {
	ctx := context.Background()
	dev, reg, err := openDevice(out)
	if err != nil {
		return err
	}
	defer dev.Close()

	// The GPU KV region, block-first: block b is blockBytes at base+b*blockBytes.
	base, err := dev.Alloc(gpuBlocks * blockBytes)
	if err != nil {
		return err
	}
	defer dev.Free(base)
	gpu, err := transfer.BlockFirstLayout(base, layers, parts, gpuBlocks, partBytes)
	if err != nil {
		return err
	}

	// One pinned region for the host pool, the staging ring and the bounce
	// slots (2 MiB: a huge page).
	// ChunkMultiple keeps every slot inside one registration: the driver
	// refuses a copy spanning two.
	region, err := pinned.Alloc(ctx, 2<<20, pinned.Options{Registrar: reg, ChunkMultiple: blockBytes})
	if err != nil {
		return err
	}
	defer region.Close()
	mem := region.Bytes()
	take := func(slots int) []byte { b := mem[:slots*blockBytes]; mem = mem[slots*blockBytes:]; return b }
	host := transfer.HostLayout{Pool: take(hostSlots), SlotBytes: blockBytes, RegistrationBytes: region.ChunkBytes()}
	staging := [][]byte{take(stagingSlots), take(stagingSlots)}
	bounceHost := transfer.HostLayout{Pool: take(bounceSlot), SlotBytes: blockBytes}

	eng, err := transfer.New(dev, transfer.Config{GPU: gpu, Host: host, Staging: staging})
	if err != nil {
		return err
	}
	defer eng.Close()
	bounce, err := transfer.New(dev, transfer.Config{GPU: gpu, Host: bounceHost})
	if err != nil {
		return err
	}
	defer bounce.Close()

	dir := nvmeDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "kvtier-server-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	store, err := nvme.Open(nvme.Config{Dirs: []string{dir}, SlotsPerFile: nvmeSlots, BlockBytes: blockBytes, MaxTokens: blockTokens})
	if err != nil {
		return err
	}
	defer store.Close()
	fmt.Fprintf(out, "nvme: %d slots in %s, %v I/O\n", store.Info().Slots, dir, store.Info().Mode)

	mover, err := kvtier.NewDeviceMover(kvtier.DeviceMoverConfig{
		Engine: eng, Host: host, BlockBytes: blockBytes,
		Store: store, NVMeSlots: nvmeSlots, StoreTokens: true, KeepBlocks: nvmeDir != "",
		Bounce: bounce, BounceHost: bounceHost,
	})
	if err != nil {
		return err
	}
	defer mover.Close()

	// Load or recompute, as for llama-3.1-8b on an H200 over PCIe 5.
	pcfg, err := cost.NewPlannerConfig("llama-3.1-8b", "h200", "pcie5-pinned", "nvme-gen5", 1, blockTokens, 1024)
	if err != nil {
		return err
	}
	cp, err := cost.NewPlanner(pcfg)
	if err != nil {
		return err
	}
	planner, err := kvtier.NewCostPlanner(cp)
	if err != nil {
		return err
	}
	seenTwice, err := policy.NewSeenTwice[kvtier.Key](1<<14, 1<<16, func(k kvtier.Key) uint64 { return uint64(k) })
	if err != nil {
		return err
	}
	cfg := kvtier.Config{BlockTokens: blockTokens, Mover: mover, Planner: planner, RecomputeCost: kvtier.RecomputeCostFunc(cp)}
	for t, n := range [kvtier.NumTiers]int{gpuBlocks, hostSlots, nvmeSlots} {
		lru, err := policy.NewDenseLRU[kvtier.BlockRef](n)
		if err != nil {
			return err
		}
		cfg.Tiers[t] = kvtier.TierConfig{CapacityBytes: int64(n) * blockBytes, SlotBytes: blockBytes, Policy: lru}
	}
	cfg.Tiers[kvtier.NVMe].Admitter = seenTwice // spare the drive: blocks used twice only
	m, err := kvtier.New(cfg)
	if err != nil {
		return err
	}
	if kept := mover.Recovered(); len(kept) > 0 {
		n, err := m.Adopt(kvtier.NVMe, kept)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "nvme: adopted %d of the %d blocks a previous run left\n", n, len(kept))
	}

	s := &server{m: m, dev: dev, base: base}
	if s.compute, err = dev.NewStream(0); err != nil {
		return err
	}
	defer s.compute.Destroy()
	if err := s.serveConversations(ctx, 8, 4); err != nil {
		return err
	}
	mover.Wait() // let background copies finish before reading the counters

	fmt.Fprintf(out, "served %d requests, %d blocks: hits gpu %d, host %d, nvme %d; %d loaded (each checked byte for byte); %d prefilled, %d of them cached; %d requests recomputed after a failed load\n",
		s.requests, s.asked, s.hits[kvtier.GPU], s.hits[kvtier.Host], s.hits[kvtier.NVMe], s.checked, s.prefilled, s.cachedNew, s.failedLoads)
	fmt.Fprintf(out, "nvme store: %d corrupt blocks dropped, %d cleared on disk\n", store.Stats().CorruptDrops, store.Stats().SlotsInvalidated)
	met := m.Metrics()
	fmt.Fprintf(out, "%-5s %6s %6s %9s %9s %9s %9s %8s\n", "tier", "hits", "misses", "bytes in", "bytes out", "evictions", "demotions", "resident")
	for t := range kvtier.NumTiers {
		tm := met.Tiers[t]
		fmt.Fprintf(out, "%-5v %6d %6d %9d %9d %9d %9d %4d/%-4d\n", t, tm.Hits, tm.Misses, tm.BytesIn, tm.BytesOut, tm.Evictions, tm.Demotions, tm.ResidentBlocks, tm.CapacitySlots)
	}
	fmt.Fprintf(out, "mover: %+v\n", mover.Stats())
	fmt.Fprintf(out, "copy engine: %d transfers, %d bytes onboarded, %d offloaded\n",
		eng.Stats().Transfers, eng.Stats().OnboardBytes, eng.Stats().OffloadBytes)
	return nil
}

// openDevice opens GPU 0, or the simulated H200 when there is no driver. The
// registrar pins host memory for that device.
func openDevice(out io.Writer) (cudastream.Device, pinned.Registrar, error) {
	dev, err := cudastream.Open(0)
	if err == nil {
		fmt.Fprintf(out, "device: %s (CUDA driver %d)\n", dev.Info().Name, dev.Info().DriverVersion)
		return dev, dev, nil
	}
	if !errors.Is(err, cudastream.ErrNoDriver) {
		return nil, nil, err
	}
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 64 << 20, Link: cudastream.H200Link(), Clock: cudastream.SimWallClock})
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintln(out, "device: simulated, with the H200 link model (no CUDA driver); host pool locked with mlock")
	return sim, &simRegistrar{sim: sim, out: out}, nil
}

// simRegistrar page-locks with mlock, as pinned does without a GPU, and
// tells the simulated device about the range so that it accepts batched
// copies from it, as a real device accepts registered memory. Where
// RLIMIT_MEMLOCK is too small (containers often allow 64 KiB) it says so
// and goes on without locking: the simulation does not need it.
type simRegistrar struct {
	sim      *cudastream.Sim
	out      io.Writer
	unlocked bool
}

func (r *simRegistrar) HostRegister(b []byte) error {
	err := pinned.MlockRegistrar{}.HostRegister(b)
	if errors.Is(err, pinned.ErrMemlockLimit) {
		fmt.Fprintf(r.out, "host memory not locked: %v\n", err)
		r.unlocked, err = true, nil
	}
	if err != nil {
		return err
	}
	if err := r.sim.HostRegister(b); err != nil {
		return errors.Join(err, r.unlock(b))
	}
	return nil
}

func (r *simRegistrar) HostUnregister(b []byte) error {
	return errors.Join(r.sim.HostUnregister(b), r.unlock(b))
}

func (r *simRegistrar) unlock(b []byte) error {
	if r.unlocked {
		return nil
	}
	return pinned.MlockRegistrar{}.HostUnregister(b)
}
