package checksum

import "testing"

func TestKeyedDiffersFromUnkeyedAndByKey(t *testing.T) {
	b := []byte("a block's payload")
	plain := New(nil)
	k1 := New([]byte("0123456789abcdef"))
	k2 := New([]byte("0123456789abcdeg"))
	if plain.Keyed() || !k1.Keyed() {
		t.Fatalf("Keyed: plain %v, keyed %v", plain.Keyed(), k1.Keyed())
	}
	if plain.Of(b) != plain.Of(b) || k1.Of(b) != k1.Of(b) {
		t.Fatal("a sum is not deterministic")
	}
	if plain.Of(b) == k1.Of(b) || k1.Of(b) == k2.Of(b) {
		t.Fatal("the key does not change the sum")
	}
	if k1.Of(b) == k1.Of(b[1:]) {
		t.Fatal("the bytes do not change the sum")
	}
}
