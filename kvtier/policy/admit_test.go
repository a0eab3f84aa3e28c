package policy

import "testing"

func identity(k uint64) uint64 { return k }

func TestAlwaysAdmit(t *testing.T) {
	var a Admitter[string] = AlwaysAdmit[string]{}
	a.Record("x")
	if !a.Admit("x") || !a.Admit("never recorded") {
		t.Fatal("AlwaysAdmit refused a key")
	}
}

func TestSeenTwiceAdmitsOnSecondRecord(t *testing.T) {
	a, err := NewSeenTwice[uint64](1<<16, 1<<20, identity)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Bytes(); got != 1<<15 {
		t.Fatalf("Bytes = %d, want %d (4 bits a counter)", got, 1<<15)
	}
	for k := range uint64(1000) {
		if a.Admit(k) {
			t.Fatalf("key %d admitted before any record", k)
		}
		a.Record(k)
	}
	once := 0
	for k := range uint64(1000) {
		if a.Admit(k) {
			once++
		}
	}
	if once > 10 {
		t.Fatalf("%d of 1000 keys recorded once were admitted (sketch collisions), want at most 10", once)
	}
	for k := range uint64(1000) {
		a.Record(k)
		if !a.Admit(k) {
			t.Fatalf("key %d recorded twice was refused", k)
		}
	}
}

func TestSeenTwiceFalseAdmissionsFallWithMemory(t *testing.T) {
	rate := func(counters int) float64 {
		a, err := NewSeenTwice[uint64](counters, 1<<30, identity)
		if err != nil {
			t.Fatal(err)
		}
		const n = 20000
		for k := range uint64(n) {
			a.Record(k)
		}
		admitted := 0
		for k := uint64(n); k < 2*n; k++ { // never recorded
			if a.Admit(k) {
				admitted++
			}
		}
		return float64(admitted) / n
	}
	small, large := rate(1<<14), rate(1<<18)
	t.Logf("false admissions after 20000 single records: %.4f with 2^14 counters, %.4f with 2^16, %.4f with 2^17, %.4f with 2^18",
		small, rate(1<<16), rate(1<<17), large)
	if large > 0.001 || large >= small {
		t.Fatalf("false admission rate %.4f (2^18 counters) vs %.4f (2^14): want under 0.001 and falling with memory", large, small)
	}
}

func TestSeenTwiceDecays(t *testing.T) {
	const window = 1000
	a, err := NewSeenTwice[uint64](1<<16, window, identity)
	if err != nil {
		t.Fatal(err)
	}
	const key = 1 << 50
	a.Record(key)
	a.Record(key)
	if !a.Admit(key) {
		t.Fatal("refused after two records")
	}
	// The window closes: its counters halve to 1.
	for k := range uint64(window - 2) {
		a.Record(k)
	}
	if a.Admit(key) {
		t.Fatal("admitted after its two records were halved")
	}
	// A hot key saturates at 15 without spilling into its neighbours, then
	// fades: 15 -> 7 -> 3 -> 1 over three windows.
	for range 100 {
		a.Record(key)
	}
	for w, want := range []bool{true, true, false} {
		for k := range uint64(window) {
			a.Record(window + k)
		}
		if got := a.Admit(key); got != want {
			t.Fatalf("after %d more windows Admit = %v, want %v", w+1, got, want)
		}
	}
}

func TestSeenTwiceRoundsCounters(t *testing.T) {
	for _, tc := range []struct {
		counters int
		bytes    int64
	}{{1, 32}, {64, 32}, {65, 64}, {1000, 512}, {1 << 20, 1 << 19}} {
		a, err := NewSeenTwice[uint64](tc.counters, 10, identity)
		if err != nil {
			t.Fatal(err)
		}
		if a.Bytes() != tc.bytes {
			t.Errorf("counters %d: Bytes = %d, want %d", tc.counters, a.Bytes(), tc.bytes)
		}
	}
}
