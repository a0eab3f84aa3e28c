package nvme

import (
	"bytes"
	"testing"
)

func FuzzDecodeHeader(f *testing.F) {
	for _, n := range []int{0, 3, 16} {
		b := make([]byte, 512)
		h := header{version: formatVersion, seq: 9, key: 1, parent: 2, salt: 3, position: 6, payloadLen: 4096,
			slot: 5, file: 1, payloadSum: 77, tokens: tokensFor(4, n)}
		encodeHeader(b, &h)
		f.Add(b)
		old := bytes.Clone(b)
		old[16] = 0
		f.Add(old)
		f.Add(b[:headerFixedBytes+2])
	}
	f.Add(make([]byte, 512))
	f.Add([]byte("KVTNVME1"))
	f.Fuzz(func(t *testing.T, src []byte) {
		var h header
		if err := decodeHeader(src, &h, 16); err != nil {
			return
		}
		if len(h.tokens) > 16 {
			t.Fatalf("decoded %d tokens, limit 16", len(h.tokens))
		}
		n := headerBytes(len(h.tokens))
		again := make([]byte, n)
		encodeHeader(again, &h)
		if !bytes.Equal(again, src[:n]) {
			t.Fatalf("decode then encode changed the header:\n%x\n%x", src[:n], again)
		}
	})
}
