package policy

import "math/bits"

// AlwaysAdmit admits every key: a tier without an admission filter.
type AlwaysAdmit[K comparable] struct{}

var _ Admitter[uint64] = AlwaysAdmit[uint64]{}

// Record does nothing.
func (AlwaysAdmit[K]) Record(K) {}

// Admit returns true.
func (AlwaysAdmit[K]) Admit(K) bool { return true }

// SeenTwice admits a key once it has been recorded at least twice within a
// decaying window, so that a block written once and never read again does not
// cost an NVMe write. It counts records in a count-min sketch of 4-bit
// counters (4 rows, conservative update: only the smallest of a key's
// counters are raised), and halves every counter each window records, as
// TinyLFU does; a key recorded twice long ago therefore falls back below
// the threshold. Memory is fixed at construction: counters/2 bytes.
//
// The sketch can overestimate (two keys sharing all four counters), never
// underestimate except through halving, so it may admit a key seen once, at a
// rate that falls as counters grows; it never refuses a key recorded twice
// since the last halving.
//
// SeenTwice has no locking inside; the caller serialises every call.
type SeenTwice[K comparable] struct {
	hash    func(K) uint64
	words   []uint64 // 4 rows of 16 counters a word
	rowMask uint64   // counters per row - 1
	window  int      // records between halvings
	records int      // records since the last halving
}

var _ Admitter[uint64] = (*SeenTwice[uint64])(nil)

const (
	sketchRows      = 4
	counterBits     = 4
	countersPerWord = 64 / counterBits
	counterMax      = 1<<counterBits - 1
	seenTwice       = 2
)

// NewSeenTwice returns a SeenTwice with counters 4-bit counters (rounded up
// to a power of two, at least 64) that halves them every window records.
// hash maps a key to 64 bits; it need not be well mixed (the identity on
// kvtier's block keys will do), as SeenTwice mixes it again.
//
// Give it about 4 counters per distinct key recorded in a window: with
// 65,536 counters (32 KiB) and 20,000 distinct keys recorded once, no
// unrecorded key was admitted in the tests, while 16,384 counters admitted 73%.
// For example, a window of 1<<20 records with counters = 4<<20 (2 MiB)
// remembers about the last million block accesses.
func NewSeenTwice[K comparable](counters, window int, hash func(K) uint64) (*SeenTwice[K], error) {
	const maxCounters = 1 << 40
	if counters <= 0 || counters > maxCounters {
		return nil, argError("NewSeenTwice", "counters", counters, "1 to 2^40")
	}
	if window <= 0 {
		return nil, argError("NewSeenTwice", "window", window, "> 0 records")
	}
	if hash == nil {
		return nil, argError("NewSeenTwice", "hash", "nil", "a function")
	}
	n := uint64(1) << bits.Len64(uint64(max(counters, 64))-1) // power of two >= counters
	perRow := n / sketchRows
	return &SeenTwice[K]{
		hash:    hash,
		words:   make([]uint64, n/countersPerWord),
		rowMask: perRow - 1,
		window:  window,
	}, nil
}

// slot returns counter r's word and shift for hash h.
func (a *SeenTwice[K]) slot(h uint64, r int) (word int, shift uint) {
	// Double hashing: row r uses h1 + r*h2, both halves of the mixed hash.
	h1, h2 := h, h>>32|h<<32|1
	c := (h1 + uint64(r)*h2) & a.rowMask
	c += uint64(r) * (a.rowMask + 1)
	return int(c / countersPerWord), uint(c%countersPerWord) * counterBits
}

// mix is the splitmix64 finalizer: it spreads a poorly mixed hash.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// Record notes one access of key.
func (a *SeenTwice[K]) Record(key K) {
	h := mix(a.hash(key))
	least := a.estimate(h)
	if least < counterMax {
		for r := range sketchRows {
			w, s := a.slot(h, r)
			if (a.words[w]>>s)&counterMax == least {
				a.words[w] += 1 << s
			}
		}
	}
	a.records++
	if a.records >= a.window {
		a.halve()
	}
}

// Admit reports whether key has been recorded at least twice in the window.
func (a *SeenTwice[K]) Admit(key K) bool {
	return a.estimate(mix(a.hash(key))) >= seenTwice
}

// estimate is the least of the key's counters.
func (a *SeenTwice[K]) estimate(h uint64) uint64 {
	least := uint64(counterMax)
	for r := range sketchRows {
		w, s := a.slot(h, r)
		least = min(least, (a.words[w]>>s)&counterMax)
	}
	return least
}

// halve halves every counter, the decay that makes old records fade.
func (a *SeenTwice[K]) halve() {
	const keep = 0x7777777777777777 // drops the bit each counter shifts into its neighbour
	for i, w := range a.words {
		a.words[i] = (w >> 1) & keep
	}
	a.records = 0
}

// Bytes is the sketch's memory.
func (a *SeenTwice[K]) Bytes() int64 { return int64(len(a.words)) * 8 }
