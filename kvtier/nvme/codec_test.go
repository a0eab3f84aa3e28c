package nvme

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// Codec values as kvtier/codec numbers them (codecvalues_test.go checks).
const (
	codecNone uint8 = 0
	codecFP8  uint8 = 1
)

// writeCodec allocates a slot and writes key's block of n bytes in codec c.
func writeCodec(t testing.TB, s *Store, key uint64, n int, c uint8) Slot {
	t.Helper()
	slot, err := s.Allocate()
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	buf := alignedBuf(t, max(n, 4096))[:n]
	fillPayload(buf, key)
	m := metaFor(key, 4)
	m.Codec = c
	if err := s.Write(context.Background(), slot, m, buf); err != nil {
		t.Fatalf("Write key %d codec %d slot %d: %v", key, c, slot, err)
	}
	return slot
}

// readCodec reads slot wanting codec want.
func readCodec(t testing.TB, s *Store, slot Slot, want uint8) (BlockMeta, []byte, error) {
	t.Helper()
	ops := []ReadOp{{Slot: slot, Dst: alignedBuf(t, 8192), WantCodec: want}}
	if err := s.ReadBatch(context.Background(), ops); err != nil {
		t.Fatalf("ReadBatch: %v", err)
	}
	return ops[0].Meta, ops[0].Dst, ops[0].Err
}

// checkCodecBlock fails unless slot reads, in codec c, as key's block of n
// bytes.
func checkCodecBlock(t testing.TB, s *Store, slot Slot, key uint64, n int, c uint8) {
	t.Helper()
	m, dst, err := readCodec(t, s, slot, c)
	if err != nil {
		t.Fatalf("read of slot %d (key %d) in codec %d: %v", slot, key, c, err)
	}
	want := make([]byte, n)
	fillPayload(want, key)
	if m.Key != key || m.Codec != c || m.PayloadBytes != n || string(dst[:n]) != string(want) {
		t.Fatalf("slot %d: key %d codec %d, %d bytes, payload equal %v; want key %d codec %d, %d bytes",
			slot, m.Key, m.Codec, m.PayloadBytes, string(dst[:n]) == string(want), key, c, n)
	}
}

// mustWrongCodec fails unless err is the miss of a read that named
// another codec than the block's: ErrNotFound and ErrCodec, not corrupt,
// naming the slot and both codecs.
func mustWrongCodec(t testing.TB, err error, slot Slot, got, want uint8) {
	t.Helper()
	mustMiss(t, err, ErrCodec)
	if errors.Is(err, ErrCorrupt) {
		t.Fatalf("err = %v: a read in the wrong codec is not corruption", err)
	}
	for _, s := range []string{fmt.Sprintf("slot %d ", slot), fmt.Sprintf("in codec %d", got), fmt.Sprintf("wants codec %d", want)} {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("err = %q, want it to say %q", err, s)
		}
	}
}

// A block is read only by a caller that names its codec; a shorter,
// encoded payload round-trips; a read in the wrong codec leaves the block.
func TestCodecIsRecordedAndChecked(t *testing.T) {
	s := mustOpen(t, testConfig(t.TempDir()))
	plain := writeCodec(t, s, 1, 8192, codecNone)
	enc := writeCodec(t, s, 2, 4100, codecFP8) // an encoded block: fewer bytes than the slot holds
	checkCodecBlock(t, s, plain, 1, 8192, codecNone)
	checkCodecBlock(t, s, enc, 2, 4100, codecFP8)

	_, _, err := readCodec(t, s, enc, codecNone)
	mustWrongCodec(t, err, enc, codecFP8, codecNone)
	_, _, err = readCodec(t, s, plain, codecFP8)
	mustWrongCodec(t, err, plain, codecNone, codecFP8)
	// Read and ReadKey read codec None only.
	_, err = s.Read(context.Background(), enc, alignedBuf(t, 8192))
	mustWrongCodec(t, err, enc, codecFP8, codecNone)
	_, _, err = s.ReadKey(context.Background(), 2, alignedBuf(t, 8192))
	mustWrongCodec(t, err, enc, codecFP8, codecNone)
	checkBlock(t, s, plain, 1, 8192)

	// The blocks stay, in their own codecs.
	checkCodecBlock(t, s, enc, 2, 4100, codecFP8)
	checkCodecBlock(t, s, plain, 1, 8192, codecNone)
	if st := s.Stats(); st.CorruptDrops != 0 || st.SlotsInvalidated != 0 || s.Len() != 2 {
		t.Fatalf("stats %+v, %d blocks: a read in the wrong codec dropped something", st, s.Len())
	}
	// A batch mixes codecs: each op is checked against its own.
	ops := []ReadOp{
		{Slot: plain, Dst: alignedBuf(t, 8192), WantCodec: codecNone},
		{Slot: enc, Dst: alignedBuf(t, 8192), WantCodec: codecFP8},
		{Slot: enc, Dst: alignedBuf(t, 8192), WantCodec: codecNone},
	}
	if err := s.ReadBatch(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	if ops[0].Err != nil || ops[0].Meta.Codec != codecNone || ops[1].Err != nil || ops[1].Meta.Codec != codecFP8 || ops[1].Meta.PayloadBytes != 4100 {
		t.Fatalf("mixed batch: %v (codec %d), %v (codec %d, %d bytes)", ops[0].Err, ops[0].Meta.Codec, ops[1].Err, ops[1].Meta.Codec, ops[1].Meta.PayloadBytes)
	}
	mustWrongCodec(t, ops[2].Err, enc, codecFP8, codecNone)
}

// rewriteCodec sets the codec byte of slot's header on disk to c and
// recomputes the header's checksum under the directory's key, as only a
// holder of the key could: the checksum then holds, and only the codec
// check can tell.
func rewriteCodec(t testing.TB, s *Store, slot Slot, c uint8) {
	t.Helper()
	cfg := s.cfg
	cs := dirSums(t, cfg.Dirs[0])
	fi, idx := s.geom.split(slot)
	patchFile(t, s.Info().Files[fi], s.geom.slotOffset(idx), func(b []byte) {
		var h header
		if err := decodeHeader(b, &h, cfg.MaxTokens, cs); err != nil {
			t.Fatalf("slot %d's header before the rewrite: %v", slot, err)
		}
		if h.codec == c {
			t.Fatalf("slot %d's header says codec %d already", slot, c)
		}
		b[19] = c
		n := headerBytes(int(binary.LittleEndian.Uint32(b[20:])))
		binary.LittleEndian.PutUint64(b[8:], cs.header(b[16:n]))
		if err := decodeHeader(b, &h, cfg.MaxTokens, cs); err != nil || h.codec != c {
			t.Fatalf("slot %d's rewritten header: codec %d, %v", slot, h.codec, err)
		}
	})
}

// A header whose codec byte changed on disk, with its checksum made to
// hold, is never served: the slot was written in another codec, so the
// read finds it corrupt and drops it (and clears it on disk).
func TestRewrittenCodecByteIsNeverServed(t *testing.T) {
	for _, tc := range []struct {
		name          string
		written, disk uint8
		n             int
	}{
		{"none read as fp8", codecNone, codecFP8, 8192},
		{"fp8 read as none", codecFP8, codecNone, 4100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			s := mustOpen(t, cfg)
			a := writeCodec(t, s, 1, tc.n, tc.written)
			b := writeCodec(t, s, 2, tc.n, tc.written)
			rewriteCodec(t, s, a, tc.disk)
			_, _, err := readCodec(t, s, a, tc.written)
			mustMiss(t, err, ErrCorrupt)
			if !strings.Contains(err.Error(), fmt.Sprintf("header says codec %d", tc.disk)) {
				t.Fatalf("err = %v, want it to name the header's codec %d", err, tc.disk)
			}
			// Asked for in the header's codec, it is not served either.
			_, _, err = readCodec(t, s, a, tc.disk)
			mustMiss(t, err)
			if st := s.Stats(); st.CorruptDrops != 1 || st.SlotsInvalidated != 1 {
				t.Fatalf("stats %+v, want the slot dropped and its header cleared", st)
			}
			checkCodecBlock(t, s, b, 2, tc.n, tc.written)
			// Cleared on disk: a restart does not adopt it.
			mustClose(t, s)
			s2 := mustOpen(t, cfg)
			if got := rangeKeys(s2); len(got) != 1 || got[2] != b {
				t.Fatalf("after a restart: %v, want key 2 only", got)
			}
		})
	}
}

// A codec byte rewritten while the store is closed is what a restart
// adopts (the header checks), and Range says so: a caller that decodes the
// codec it wrote is never handed the block.
func TestRewrittenCodecByteAtRestart(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := mustOpenNoCleanup(t, cfg)
	a := writeCodec(t, s, 1, 8192, codecNone)
	mustClose(t, s)
	rewriteCodec(t, s, a, codecFP8)
	s2 := mustOpen(t, cfg)
	var listed []BlockMeta
	s2.Range(func(_ Slot, m BlockMeta) bool { listed = append(listed, m); return true })
	if len(listed) != 1 || listed[0].Codec != codecFP8 {
		t.Fatalf("Range lists %+v, want key 1 in codec %d", listed, codecFP8)
	}
	_, _, err := readCodec(t, s2, a, codecNone)
	mustWrongCodec(t, err, a, codecFP8, codecNone)
}

// Recovery of a file that holds blocks of two codecs: Open keeps them all
// and Range lists each one's codec and size; each reads in its own codec
// only. A caller that decodes None only (a server restarted with another
// codec setting) frees the rest, as Range's contract asks, and adopts
// nothing it cannot decode.
func TestRecoverMixedCodecs(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := mustOpenNoCleanup(t, cfg)
	type blk struct {
		slot  Slot
		n     int
		codec uint8
	}
	want := map[uint64]blk{}
	for k := uint64(1); k <= 8; k++ {
		c, n := codecNone, 8192
		if k%2 == 0 {
			c, n = codecFP8, 4100+int(k)
		}
		want[k] = blk{writeCodec(t, s, k, n, c), n, c}
	}
	mustClose(t, s)

	s2 := mustOpen(t, cfg)
	if st := s2.Stats(); st.Recovered != 8 || st.CorruptDrops != 0 {
		t.Fatalf("stats after reopen %+v, want 8 blocks recovered", st)
	}
	listed := 0
	s2.Range(func(slot Slot, m BlockMeta) bool {
		listed++
		w, ok := want[m.Key]
		if !ok || slot != w.slot || m.Codec != w.codec || m.PayloadBytes != w.n {
			t.Errorf("Range: slot %d key %d codec %d, %d bytes; want slot %d codec %d, %d bytes", slot, m.Key, m.Codec, m.PayloadBytes, w.slot, w.codec, w.n)
		}
		return true
	})
	if listed != 8 {
		t.Fatalf("Range listed %d blocks, want 8", listed)
	}
	for k, w := range want {
		checkCodecBlock(t, s2, w.slot, k, w.n, w.codec)
		_, _, err := readCodec(t, s2, w.slot, w.codec^1)
		mustWrongCodec(t, err, w.slot, w.codec, w.codec^1)
	}

	// A None-only adopter.
	var adopted []uint64
	s2.Range(func(slot Slot, m BlockMeta) bool {
		if m.Codec != codecNone {
			if err := s2.Free(slot); err != nil {
				t.Fatalf("Free slot %d: %v", slot, err)
			}
			return true
		}
		adopted = append(adopted, m.Key)
		return true
	})
	if len(adopted) != 4 || s2.Len() != 4 {
		t.Fatalf("adopted %v, %d blocks left, want the 4 of codec None", adopted, s2.Len())
	}
	for _, k := range adopted {
		checkBlock(t, s2, want[k].slot, k, 8192)
	}
}
