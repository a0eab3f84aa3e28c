package httpapi

import (
	"testing"

	"kvtier.dev/internal/openai"
)

// FuzzDecodeRequest: any body decodes without panicking, and a request it
// accepts is within the model's limits (checked without overflow: a
// max_tokens near MaxInt must not wrap the sum past the context).
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{`{"prompt":"hi","max_tokens":3}`, `{"prompt":[1,2],"stream":true,"user":"u"}`,
		`{"prompt":[1,2],"max_tokens":63}`, `{"prompt":[511],"temperature":0,"n":1}`, `{}`, `[`, `{"prompt":"x"} 1`,
		`{"prompt":[1],"max_tokens":9223372036854775807}`, `{"prompt":"ab","max_tokens":9223372036854775806}`} {
		f.Add([]byte(s))
	}
	lim := Limits{Model: "m", ContextTokens: 64, VocabSize: 512}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, toks, err := decodeRequest(body, lim, 16)
		if err != nil {
			return
		}
		mt := *req.MaxTokens
		if len(toks) == 0 || len(toks) > lim.ContextTokens || mt < 1 || mt > lim.ContextTokens-len(toks) {
			t.Fatalf("%s: accepted %d tokens and max_tokens %d", body, len(toks), mt)
		}
		for _, tok := range toks {
			if tok < 0 || int(tok) >= lim.VocabSize {
				t.Fatalf("%s: accepted token %d", body, tok)
			}
		}
	})
}

// TestStreamTokenAllocs: writing a token's event into the handler's
// buffer and timing it allocate nothing, once the buffers have grown.
func TestStreamTokenAllocs(t *testing.T) {
	a, err := New(Config{Backend: newTestBackend()})
	if err != nil {
		t.Fatal(err)
	}
	c := &completion{api: a, id: "cmpl-1", model: "m", timer: tokenTimer{m: a.m}}
	prefix := c.chunkPrefix()
	buf := make([]byte, 0, 4<<10)
	var scratch []byte
	tok := int32(0)
	allocs := testing.AllocsPerRun(1000, func() {
		tok = (tok + 1) % 300
		c.timer.token(c.timer.start)
		scratch = openai.AppendTokenText(scratch[:0], tok)
		buf = appendTokenEvent(buf[:0], prefix, scratch, tok, nil)
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per token", allocs)
	}
}
