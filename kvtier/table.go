package kvtier

// table maps a block Key to its record with open addressing and linear
// probing, in two flat arrays (no pointers, 12 bytes a slot). Deletion shifts
// later entries back, so there are no tombstones. Not safe for concurrent use.
type table struct {
	keys  []Key
	vals  []uint32 // record index + 1; 0 marks an empty slot
	shift uint     // 64 - log2(len(keys))
	n     int
}

const tableMinBits = 10

func (t *table) init(bits uint) {
	t.keys = make([]Key, 1<<bits)
	t.vals = make([]uint32, 1<<bits)
	t.shift = 64 - bits
	t.n = 0
}

// home is k's preferred slot: Fibonacci hashing spreads keys that are small
// integers (trace ids) as well as hashes.
func (t *table) home(k Key) int {
	return int((uint64(k) * 0x9E3779B97F4A7C15) >> t.shift)
}

func (t *table) find(k Key) (uint32, bool) {
	if t.keys == nil {
		return 0, false
	}
	mask := len(t.keys) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		v := t.vals[i]
		if v == 0 {
			return 0, false
		}
		if t.keys[i] == k {
			return v - 1, true
		}
	}
}

// insert adds k, which MUST NOT be present.
func (t *table) insert(k Key, idx uint32) {
	if t.keys == nil {
		t.init(tableMinBits)
	}
	if (t.n+1)*4 > len(t.keys)*3 {
		t.grow()
	}
	mask := len(t.keys) - 1
	i := t.home(k)
	for t.vals[i] != 0 {
		i = (i + 1) & mask
	}
	t.keys[i], t.vals[i] = k, idx+1
	t.n++
}

func (t *table) grow() {
	keys, vals := t.keys, t.vals
	t.init(64 - t.shift + 1)
	mask := len(t.keys) - 1
	for j, v := range vals {
		if v == 0 {
			continue
		}
		i := t.home(keys[j])
		for t.vals[i] != 0 {
			i = (i + 1) & mask
		}
		t.keys[i], t.vals[i] = keys[j], v
		t.n++
	}
}

// remove deletes k if present.
func (t *table) remove(k Key) {
	if t.keys == nil {
		return
	}
	mask := len(t.keys) - 1
	i := t.home(k)
	for {
		if t.vals[i] == 0 {
			return
		}
		if t.keys[i] == k {
			break
		}
		i = (i + 1) & mask
	}
	// Shift back every later entry of the run whose home does not lie
	// cyclically in (i, j].
	for j := (i + 1) & mask; t.vals[j] != 0; j = (j + 1) & mask {
		h := t.home(t.keys[j])
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.keys[i], t.vals[i] = t.keys[j], t.vals[j]
			i = j
		}
	}
	t.keys[i], t.vals[i] = 0, 0
	t.n--
}

func (t *table) len() int { return t.n }
