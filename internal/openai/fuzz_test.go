package openai

import (
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"testing"
)

// FuzzEventReader: any input reads without panicking, and an event that
// AppendEvent wrote reads back as its data.
func FuzzEventReader(f *testing.F) {
	f.Add([]byte("data: x\n\n"), []byte("y"))
	f.Add([]byte(": c\r\ndata:a\r\ndata: b\r\n\r\n"), []byte(" lead"))
	f.Add([]byte("data"), []byte(`{"a":[1,2]}`))
	f.Fuzz(func(t *testing.T, in, data []byte) {
		r := NewEventReader(bytes.NewReader(in))
		for range 1000 {
			if _, err := r.Next(); err != nil {
				break
			}
		}
		if bytes.ContainsAny(data, "\r\n") {
			return
		}
		r = NewEventReader(bytes.NewReader(AppendEvent(nil, data)))
		got, err := r.Next()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%q reads back as %q, %v", data, got, err)
		}
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("after the one event: %v", err)
		}
	})
}

// FuzzPrompt: any JSON decodes without panicking, and a decoded prompt
// encodes and decodes to itself.
func FuzzPrompt(f *testing.F) {
	for _, s := range []string{`"hi"`, `[1,2,3]`, `[]`, `[1,"a"]`, `[[1]]`, `null`, `7`, `[1e3]`, `[-0]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var p Prompt
		if err := json.Unmarshal(in, &p); err != nil {
			return
		}
		out, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var q Prompt
		if err := json.Unmarshal(out, &q); err != nil {
			t.Fatalf("%s: re-decoding %s: %v", in, out, err)
		}
		if p.IsTokens != q.IsTokens || p.Text != q.Text || !slices.Equal(p.Tokens, q.Tokens) {
			t.Fatalf("%s: %+v, then %+v", in, p, q)
		}
	})
}
