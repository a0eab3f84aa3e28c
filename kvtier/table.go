package kvtier

// table maps a block's (Salt, Key) to its record with open addressing and
// linear probing, in one flat array of 16-byte entries (no pointers): a
// probe reads the key and the record index from one cache line (four
// entries to a line, none straddling two), so a lookup of a block costs one
// miss here. An entry also keeps 32 bits of the block's token hash (see
// tokenHash), so that CachedPrefix verifies a block without reading its
// tokens. Deletion shifts later entries back, so there are no tombstones.
// Not safe for concurrent use.
//
// The salt is mixed into the key it indexes by (indexKey), so that equal
// keys under different salts (per-tenant trace ids that each start at 1)
// are different entries rather than one that blocks the other from the
// cache. Two pairs that mix to the same index key still share one entry;
// the record's salt, parent and tokens decide a hit (invariant 1), so such a
// collision is a miss, never a wrong block.
type table struct {
	slots []tableEntry
	shift uint // 64 - log2(len(slots))
	n     int
}

// tableEntry is a key split in two halves (4-byte alignment keeps the entry
// 16 bytes), its record index + 1 (0 marks an empty slot), and the record's
// token hash (0 for a block stored without tokens).
type tableEntry struct {
	lo, hi uint32
	val    uint32
	tokens uint32
}

func (e *tableEntry) key() Key { return Key(e.lo) | Key(e.hi)<<32 }

// indexKey is the key the table stores for k under salt s: k itself for
// salt 0, else k xor a 64-bit mix of s (splitmix64's finaliser), which
// spreads salts that are small integers over every bit.
func indexKey(s Salt, k Key) Key { return k ^ saltMix(s) }

// saltMix is what indexKey xors into a key of salt s: 0 for salt 0. A walk
// over many keys of one salt computes it once.
func saltMix(s Salt) Key {
	if s == 0 {
		return 0
	}
	z := uint64(s) + 0x9E3779B97F4A7C15
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return Key(z ^ z>>31)
}

const tableMinBits = 10

func (t *table) init(bits uint) {
	t.slots = make([]tableEntry, 1<<bits)
	t.shift = 64 - bits
	t.n = 0
}

// home is k's preferred slot: Fibonacci hashing spreads keys that are small
// integers (trace ids) as well as hashes.
func (t *table) home(k Key) int {
	return int((uint64(k) * 0x9E3779B97F4A7C15) >> t.shift)
}

// find returns the record index of (s, k).
func (t *table) find(s Salt, k Key) (uint32, bool) {
	if e := t.entry(indexKey(s, k)); e != nil {
		return e.val - 1, true
	}
	return 0, false
}

// entry is the entry of an index key (indexKey's result), nil if absent.
// It is valid until the table next changes.
func (t *table) entry(k Key) *tableEntry {
	if t.slots == nil {
		return nil
	}
	mask := len(t.slots) - 1
	lo, hi := uint32(k), uint32(k>>32)
	for i := t.home(k); ; i = (i + 1) & mask {
		e := &t.slots[i]
		if e.val == 0 {
			return nil
		}
		if e.lo == lo && e.hi == hi {
			return e
		}
	}
}

// setTokens records the token hash of (s, k), which MUST be present.
func (t *table) setTokens(s Salt, k Key, tokens uint32) {
	t.entry(indexKey(s, k)).tokens = tokens
}

// insert adds (s, k) with its record index and token hash; (s, k) MUST
// NOT be present.
func (t *table) insert(s Salt, k Key, idx, tokens uint32) {
	k = indexKey(s, k)
	if t.slots == nil {
		t.init(tableMinBits)
	}
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	t.place(tableEntry{lo: uint32(k), hi: uint32(k >> 32), val: idx + 1, tokens: tokens})
	t.n++
}

func (t *table) place(e tableEntry) {
	mask := len(t.slots) - 1
	i := t.home(e.key())
	for t.slots[i].val != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = e
}

func (t *table) grow() {
	old := t.slots
	t.init(64 - t.shift + 1)
	for j := range old {
		if e := old[j]; e.val != 0 {
			t.place(e)
			t.n++
		}
	}
}

// remove deletes (s, k) if present.
func (t *table) remove(s Salt, k Key) {
	k = indexKey(s, k)
	if t.slots == nil {
		return
	}
	mask := len(t.slots) - 1
	i := t.home(k)
	for {
		e := &t.slots[i]
		if e.val == 0 {
			return
		}
		if e.key() == k {
			break
		}
		i = (i + 1) & mask
	}
	// Shift back every later entry of the run whose home does not lie
	// cyclically in (i, j].
	for j := (i + 1) & mask; t.slots[j].val != 0; j = (j + 1) & mask {
		h := t.home(t.slots[j].key())
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = tableEntry{}
	t.n--
}

func (t *table) len() int { return t.n }
