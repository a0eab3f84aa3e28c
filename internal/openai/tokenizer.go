package openai

import (
	"encoding/binary"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// ByteVocab is the number of token ids the byte-level tokenizer uses: token
// id b is byte b.
const ByteVocab = 256

// AppendBytesAsTokens appends the byte-level tokens of s (one token per
// byte, id = the byte's value) to dst and returns it. No download, no
// vocabulary file: any model whose vocabulary has at least ByteVocab ids
// can read it.
func AppendBytesAsTokens(dst []int32, s string) []int32 {
	for i := 0; i < len(s); i++ {
		dst = append(dst, int32(s[i]))
	}
	return dst
}

// AppendTokenText appends the text of token id to dst: the byte it stands
// for when id < ByteVocab, U+FFFD otherwise (a model's vocabulary may be
// larger than the tokenizer's). Bytes that do not form valid UTF-8 become
// U+FFFD when the text is JSON-encoded; clients that need exact output read
// token_ids.
func AppendTokenText(dst []byte, id int32) []byte {
	if id >= 0 && id < ByteVocab {
		return append(dst, byte(id))
	}
	return utf8.AppendRune(dst, utf8.RuneError)
}

// SaltOf returns the kvtier salt of a request's user and salt fields: 0
// when both are empty (the shared, default tenant), otherwise
// xxhash64(len(user) ‖ user ‖ salt), lengths little-endian on 8 bytes, so
// that ("ab", "c") and ("a", "bc") differ.
func SaltOf(user, salt string) uint64 {
	if user == "" && salt == "" {
		return 0
	}
	d := xxhash.New()
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(user)))
	d.Write(n[:])
	d.WriteString(user)
	d.WriteString(salt)
	return d.Sum64()
}
