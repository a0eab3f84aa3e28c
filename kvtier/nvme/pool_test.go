package nvme

import (
	"context"
	"testing"
)

// TestReadReleasesWorkerBeforeHashing checks that a read gives its worker
// back once the I/O and the header check are done, so that hashing its
// payload never holds a worker that another read's I/O could use, and that
// the payload is still checked before the read succeeds.
func TestReadReleasesWorkerBeforeHashing(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.Workers = 1
	s := mustOpen(t, cfg)
	a := writeKey(t, s, 1, 8192)
	b := writeKey(t, s, 2, 8192)

	hashing, resume := make(chan int), make(chan struct{})
	testHookPayloadCheck = func(first Slot) {
		if first == a {
			hashing <- len(s.pool.idle)
			<-resume
		}
	}
	t.Cleanup(func() { testHookPayloadCheck = nil })

	dst := alignedBuf(t, 8192)
	done := make(chan error)
	go func() {
		m, err := s.Read(context.Background(), a, dst)
		if err == nil && m.Key != 1 {
			t.Errorf("read of slot %d gave key %d", a, m.Key)
		}
		done <- err
	}()
	if idle := <-hashing; idle != 1 {
		close(resume)
		<-done
		t.Fatalf("%d idle workers of 1 while slot %d's payload waits for its hash", idle, a)
	}
	// The only worker is free: a read of another slot completes meanwhile.
	checkBlock(t, s, b, 2, 8192)
	close(resume)
	if err := <-done; err != nil {
		t.Fatalf("read of slot %d: %v", a, err)
	}
	want := make([]byte, 8192)
	fillPayload(want, 1)
	if string(dst) != string(want) {
		t.Fatal("payload differs from what was written")
	}
}

// TestPayloadFlippedAfterHeaderCheck flips a payload byte in the caller's
// buffer between the header check and the payload hash (the window this
// split opened): the read must fail as corrupt, never succeed.
func TestPayloadFlippedAfterHeaderCheck(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := mustOpen(t, cfg)
	var slots []Slot
	for k := range uint64(4) {
		slots = append(slots, writeKey(t, s, k+1, 8192))
	}
	// Slots 0 and 2 of the batch, not adjacent: two runs, one hashed on a
	// goroutine of its own.
	ops := []ReadOp{{Slot: slots[0], Dst: alignedBuf(t, 8192)}, {Slot: slots[2], Dst: alignedBuf(t, 8192)}}
	victim := ops[1].Dst
	testHookPayloadCheck = func(first Slot) {
		if first == slots[2] {
			victim[100] ^= 1
		}
	}
	t.Cleanup(func() { testHookPayloadCheck = nil })
	if err := s.ReadBatch(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	if ops[0].Err != nil {
		t.Fatalf("untouched slot %d: %v", ops[0].Slot, ops[0].Err)
	}
	mustMiss(t, ops[1].Err, ErrCorrupt)
	if st := s.Stats(); st.CorruptDrops != 1 {
		t.Fatalf("CorruptDrops = %d, want 1", st.CorruptDrops)
	}
}
