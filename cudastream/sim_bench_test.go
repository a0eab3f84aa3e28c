package cudastream

import "testing"

// BenchmarkSimCopy is the sim's own overhead per single copy, enqueued and
// completed on the virtual clock (instantaneous link, 4 KiB, pinned).
func BenchmarkSimCopy(b *testing.B) {
	s := newTestSim(b, SimVirtualClock, LinkModel{})
	st := mustStream(b, s, 0)
	p := mustAlloc(b, s, 4096)
	host, err := s.HostAlloc(4096)
	must(b, err)
	b.SetBytes(4096)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := st.CopyHtoD(p, host); err != nil {
			b.Fatal(err)
		}
		if i%64 == 63 {
			if err := st.Synchronize(); err != nil {
				b.Fatal(err)
			}
		}
	}
	must(b, st.Synchronize())
}

// BenchmarkSimBatch10000 is one 10,000-descriptor batch of 256 bytes each,
// enqueued and completed on the virtual clock.
func BenchmarkSimBatch10000(b *testing.B) {
	const descs, size = 10000, 256
	s := newTestSim(b, SimVirtualClock, H200Link())
	st := mustStream(b, s, 0)
	p := mustAlloc(b, s, descs*size)
	host, err := s.HostAlloc(descs * size)
	must(b, err)
	ops := make([]Copy, descs)
	for i := range ops {
		ops[i] = Copy{Dst: uint64(p) + uint64(i*size), Src: HostAddr(host[i*size:]), Bytes: size}
	}
	b.SetBytes(descs * size)
	b.ReportAllocs()
	for b.Loop() {
		if err := st.CopyBatch(HostToDevice, ops); err != nil {
			b.Fatal(err)
		}
		if err := st.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
}
