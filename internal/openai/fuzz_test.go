package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
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

// FuzzPrompt: any bytes decode without panicking, as encoding/json reads
// them (a string, or an array of integers from 0 to 2^31-1, and nothing
// else); a decoded prompt encodes and decodes to itself; bounded at max
// tokens, a prompt is read alike when it has at most max and is
// ErrPromptTooLong when it has more.
func FuzzPrompt(f *testing.F) {
	for _, s := range []string{`"hi"`, `[1,2,3]`, `[]`, `[1,"a"]`, `[[1]]`, `null`, `7`, `[1e3]`, `[-0]`, ` [ 1 , 2 ] `, `[01]`, `[2147483648]`} {
		f.Add([]byte(s), uint8(2))
	}
	f.Fuzz(func(t *testing.T, in []byte, max uint8) {
		p, err := DecodePrompt(in, -1)
		want, ok := referencePrompt(in)
		if (err == nil) != ok || ok && (p.IsTokens != want.IsTokens || p.Text != want.Text || !slices.Equal(p.Tokens, want.Tokens)) {
			t.Fatalf("%q: decoded %+v, %v; encoding/json reads %+v, %v", in, p, err, want, ok)
		}
		bounded, berr := DecodePrompt(in, int(max))
		switch n := len(p.Text) + len(p.Tokens); {
		case err != nil:
			if berr == nil {
				t.Fatalf("%q: bounded at %d, decoded %+v; unbounded, %v", in, max, bounded, err)
			}
			return
		case n > int(max):
			if !errors.Is(berr, ErrPromptTooLong) {
				t.Fatalf("%q: %d tokens bounded at %d: %v", in, n, max, berr)
			}
		case berr != nil || bounded.Text != p.Text || !slices.Equal(bounded.Tokens, p.Tokens):
			t.Fatalf("%q: bounded at %d, %+v, %v; want %+v", in, max, bounded, berr, p)
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

// referencePrompt reads in as a prompt through encoding/json alone.
func referencePrompt(in []byte) (Prompt, bool) {
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return Prompt{}, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return Prompt{}, false
	}
	switch v := v.(type) {
	case string:
		return TextPrompt(v), true
	case []any:
		ids := []int32{}
		for _, e := range v {
			n, ok := e.(json.Number)
			if !ok {
				return Prompt{}, false
			}
			id, err := strconv.ParseInt(string(n), 10, 32)
			if err != nil || id < 0 {
				return Prompt{}, false
			}
			ids = append(ids, int32(id))
		}
		return TokenPrompt(ids), true
	}
	return Prompt{}, false
}
