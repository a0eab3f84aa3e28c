package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
)

// salt separates this model (and tenant) from any other sharing the cache.
const salt kvtier.Salt = 0x6b76

// server is the part of a model server that talks to kvtier.
type server struct {
	m       *kvtier.Manager
	dev     cudastream.Device
	base    cudastream.DevicePtr // the GPU KV region
	compute cudastream.Stream    // stands in for the model's compute stream
	kv, got [blockBytes]byte     // one block's KV, written and read back

	requests, asked, checked int
	prefilled, cachedNew     int // blocks computed; those of them cached
	failedLoads              int // requests whose load failed (a corrupt NVMe block, say) and were recomputed
	hits                     [kvtier.NumTiers]int
}

// serveConversations runs convs conversations of turns turns each, round
// robin, all behind one shared system prompt, so that a conversation's next
// turn finds its history pushed down to the host or NVMe by the others.
func (s *server) serveConversations(ctx context.Context, convs, turns int) error {
	system := tokens(0, 2*blockTokens)
	history := make([][]int32, convs)
	for c := range history {
		history[c] = slices.Clone(system)
	}
	for turn := range turns {
		for c := range history {
			// The user's message and the model's reply: three blocks more.
			history[c] = append(history[c], tokens(1+c*turns+turn, 3*blockTokens)...)
			if err := s.serve(ctx, history[c]); err != nil {
				return fmt.Errorf("conversation %d, turn %d: %w", c, turn, err)
			}
			// Let the background copies (demotions) finish before the
			// next request, so that what each lookup finds, and the
			// figures printed, do not depend on scheduling. A server
			// would not wait: its next lookup finds whatever has landed.
			if err := s.m.Drain(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// tokens returns n token ids of a made-up message.
func tokens(seed, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(seed*4099 + i)
	}
	return t
}

// serve handles one request: load what is cached, prefill the rest, cache
// the result.
func (s *server) serve(ctx context.Context, prompt []int32) error {
	s.requests++
	s.asked += len(prompt) / blockTokens

	// 1. What is cached, and where; lease it so that nothing is evicted.
	var l kvtier.Lease
	if err := s.m.Lookup(salt, prompt, &l); err != nil {
		return err
	}
	defer s.m.Release(&l)
	for _, b := range l.Blocks {
		s.hits[b.Tier]++
	}
	// 2. Load or recompute each cached block, and load.
	if err := s.m.Plan(&l); err != nil {
		return err
	}
	if err := s.m.Onboard(&l); err != nil {
		return err
	}
	loadErr := s.m.Wait(ctx, &l)
	if loadErr != nil && !errors.Is(loadErr, kvtier.ErrMove) {
		return loadErr
	}
	if loadErr != nil {
		// A load failed (a corrupt NVMe block: the store dropped it and
		// cleared it on disk). Not fatal: what did not arrive is prefilled
		// below like a miss, and counted.
		s.failedLoads++
	}
	ready := 0 // blocks in the GPU now: used or loaded
	for _, b := range l.Blocks {
		switch {
		case b.Loading && loadErr != nil:
			// Counted as prefilled: which of the loads failed is not known here.
		case b.Loading:
			if err := s.check(b.Key, b.GPUSlot); err != nil {
				return err
			}
			ready++
		case b.Action == kvtier.Use:
			ready++
		}
	}
	s.prefilled += len(prompt)/blockTokens - ready

	// 3. Prefill: blocks not in the GPU get a slot and their KV is
	// computed into it (here: written, deterministic from the key).
	var w kvtier.Lease
	err := s.m.Insert(salt, prompt, kvtier.GPU, &w)
	defer s.m.Release(&w)
	if err != nil && !errors.Is(err, kvtier.ErrNoSpace) {
		return err // ErrNoSpace: the blocks from there on are computed but not cached
	}
	for _, b := range w.Blocks {
		if b.Write {
			if err := s.prefill(b.Key, b.Slot); err != nil {
				return errors.Join(err, s.m.Commit(&w, err))
			}
			s.cachedNew++
		}
	}
	if err := s.m.Commit(&w, nil); err != nil {
		return err
	}

	// 4. Keep a copy in the host pool, so that the GPU can evict for free.
	if err := s.m.Offload(&w, kvtier.Host); err != nil {
		return err
	}
	return s.m.Wait(ctx, &w)
}

func (s *server) blockAddr(slot kvtier.Slot) cudastream.DevicePtr {
	return s.base + cudastream.DevicePtr(int64(slot)*blockBytes)
}

// kvOf fills s.kv with block k's KV: any function of the key would do.
func (s *server) kvOf(k kvtier.Key) []byte {
	for i := range s.kv {
		s.kv[i] = byte(uint64(k)>>(8*(i%8))) ^ byte(i/8)
	}
	return s.kv[:]
}

func (s *server) prefill(k kvtier.Key, slot kvtier.Slot) error {
	if err := s.compute.CopyHtoD(s.blockAddr(slot), s.kvOf(k)); err != nil {
		return err
	}
	return s.compute.Synchronize()
}

// check reads a loaded block back from the GPU and compares it with its KV.
func (s *server) check(k kvtier.Key, slot kvtier.Slot) error {
	if err := s.compute.CopyDtoH(s.got[:], s.blockAddr(slot)); err != nil {
		return err
	}
	if err := s.compute.Synchronize(); err != nil {
		return err
	}
	if !bytes.Equal(s.got[:], s.kvOf(k)) {
		return fmt.Errorf("block %#x loaded into GPU slot %d holds other bytes", uint64(k), slot)
	}
	s.checked++
	return nil
}
