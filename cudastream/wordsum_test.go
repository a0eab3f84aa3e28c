package cudastream_test

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"kvtier.dev/internal/checksum"
	"kvtier.dev/internal/gputest"

	// The GPU tests are outside the package: export_test.go says why.
	. "kvtier.dev/cudastream"
)

// wordSumsAgree lays out blocks of pieces in device memory with a gap
// between blocks, fills them with random bytes, sums some of the blocks on
// the device and checks each sum against checksum.WordSum of the block's
// bytes in host order. pieceBytes covers one chunk, several, and a partial
// last chunk.
func wordSumsAgree(t *testing.T, d Device, pieces int, pieceBytes int64, numBlocks int, blocks []int32) {
	t.Helper()
	stride := pieceBytes + 4096 // a gap the sums must not read
	l := SumLayout{Pieces: pieces, PieceBytes: pieceBytes, BlockStride: stride}
	st, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer st.Destroy()
	ws, ok := st.(WordSummer)
	if !ok {
		t.Fatal("the stream does not implement WordSummer")
	}
	r := rand.New(rand.NewPCG(uint64(pieces), uint64(pieceBytes)))
	host := make([][]byte, pieces) // piece p of every block, as laid out
	bases := make([]byte, 8*pieces)
	for p := range pieces {
		n := int64(numBlocks) * stride
		ptr, err := d.Alloc(n)
		cuMust(t, "Alloc", err)
		defer d.Free(ptr)
		host[p] = make([]byte, n)
		cuRandom(r, host[p])
		cuMust(t, "CopyHtoD", st.CopyHtoD(ptr, host[p]))
		binary.LittleEndian.PutUint64(bases[8*p:], uint64(ptr))
	}
	bp, err := d.Alloc(int64(len(bases)))
	cuMust(t, "Alloc", err)
	defer d.Free(bp)
	cuMust(t, "CopyHtoD", st.CopyHtoD(bp, bases))
	l.Bases = bp
	per := l.PartialsPerBlock()
	out, err := d.Alloc(int64(len(blocks)*per) * 8)
	cuMust(t, "Alloc", err)
	defer d.Free(out)
	cuMust(t, "WordSums", ws.WordSums(l, blocks, out))
	got := make([]byte, len(blocks)*per*8)
	cuMust(t, "CopyDtoH", st.CopyDtoH(got, out))
	cuMust(t, "Synchronize", st.Synchronize())
	for i, b := range blocks {
		block := make([]byte, 0, l.BlockBytes())
		for p := range pieces {
			off := int64(b) * stride
			block = append(block, host[p][off:off+pieceBytes]...)
		}
		partials := make([]uint64, per)
		for k := range partials {
			partials[k] = binary.LittleEndian.Uint64(got[8*(i*per+k):])
		}
		if sum, want := WordSumOfPartials(partials, l.BlockBytes()), checksum.WordSum(block); sum != want {
			t.Fatalf("block %d (index %d): device sum %#x, checksum.WordSum %#x", b, i, sum, want)
		}
	}
}

func testWordSums(t *testing.T, d Device) {
	wordSumsAgree(t, d, 3, 72<<10, 4, []int32{2, 0, 3})
	wordSumsAgree(t, d, 64, 4096, 3, []int32{1, 1, 2})
	blocks := make([]int32, 300) // more than one launch holds
	for i := range blocks {
		blocks[i] = int32(i % 7)
	}
	wordSumsAgree(t, d, 2, 8, 7, blocks)
}

func TestSimWordSums(t *testing.T) {
	d, err := NewSim(SimConfig{MemoryBytes: 64 << 20})
	cuMust(t, "NewSim", err)
	testWordSums(t, d)
}

func TestCuWordSums(t *testing.T) { testWordSums(t, gputest.Device(t)) }

// TestWordSumsBadInput: a bad layout, block or output names what was wrong
// and enqueues nothing; a TimingOnly simulator cannot sum.
func TestWordSumsBadInput(t *testing.T) {
	d, err := NewSim(SimConfig{MemoryBytes: 1 << 20})
	cuMust(t, "NewSim", err)
	st, _ := d.NewStream(0)
	ws := st.(WordSummer)
	p, _ := d.Alloc(4096)
	good := SumLayout{Bases: p, Pieces: 1, PieceBytes: 64, BlockStride: 64}
	for _, c := range []struct {
		name   string
		l      SumLayout
		blocks []int32
		out    DevicePtr
	}{
		{"no pieces", SumLayout{Bases: p, PieceBytes: 64}, []int32{0}, p},
		{"piece not words", SumLayout{Bases: p, Pieces: 1, PieceBytes: 12}, []int32{0}, p},
		{"odd stride", SumLayout{Bases: p, Pieces: 1, PieceBytes: 64, BlockStride: 68}, []int32{0}, p},
		{"null bases", SumLayout{Pieces: 1, PieceBytes: 64}, []int32{0}, p},
		{"negative block", good, []int32{-1}, p},
		{"null output", good, []int32{0}, 0},
		{"bases not in memory", SumLayout{Bases: 8, Pieces: 1, PieceBytes: 64}, []int32{0}, p},
	} {
		if err := ws.WordSums(c.l, c.blocks, c.out); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("%s: %v, want ErrInvalidValue", c.name, err)
		}
	}
	if err := ws.WordSums(good, nil, 0); err != nil {
		t.Errorf("no blocks: %v", err)
	}
	cuMust(t, "Synchronize", st.Synchronize())
	// The pieces' addresses are read when the kernel runs, as on the GPU: a
	// piece outside device memory faults the stream.
	cuMust(t, "CopyHtoD", st.CopyHtoD(p, []byte{8, 0, 0, 0, 0, 0, 0, 0}))
	cuMust(t, "WordSums", ws.WordSums(good, []int32{0}, p+64))
	if err := st.Synchronize(); err == nil {
		t.Error("a piece outside device memory did not fault the stream")
	}
	to, err := NewSim(SimConfig{MemoryBytes: 1 << 20, TimingOnly: true})
	cuMust(t, "NewSim", err)
	tst, _ := to.NewStream(0)
	tp, _ := to.Alloc(4096)
	if err := tst.(WordSummer).WordSums(SumLayout{Bases: tp, Pieces: 1, PieceBytes: 64}, []int32{0}, tp); !errors.Is(err, ErrNotSupported) {
		t.Errorf("TimingOnly: %v, want ErrNotSupported", err)
	}
}
