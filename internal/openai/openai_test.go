package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestPromptJSON(t *testing.T) {
	good := []struct {
		in   string
		want Prompt
	}{
		{`"hi"`, TextPrompt("hi")},
		{`[1, 2,2147483647]`, TokenPrompt([]int32{1, 2, 2147483647})},
		{`[]`, TokenPrompt([]int32{})},
	}
	for _, c := range good {
		var p Prompt
		if err := json.Unmarshal([]byte(c.in), &p); err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if p.IsTokens != c.want.IsTokens || p.Text != c.want.Text || len(p.Tokens) != len(c.want.Tokens) {
			t.Fatalf("%s: %+v, want %+v", c.in, p, c.want)
		}
		back, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.ReplaceAll(c.in, " ", "") != string(back) {
			t.Fatalf("%s marshals back to %s", c.in, back)
		}
	}
	bad := map[string]string{
		`null`:         "null",
		`5`:            "want a string",
		`[1,-1]`:       "token 1",
		`[2147483648]`: "token 0",
		`[1.5]`:        "token 0",
		`["a"]`:        "batches",
		`[[1]]`:        "batches",
		`[1,`:          "",
	}
	for in, msg := range bad {
		var req CompletionRequest
		err := json.Unmarshal([]byte(`{"prompt":`+in+`}`), &req)
		if err == nil {
			t.Errorf("%s: no error", in)
			continue
		}
		var fe *FieldError
		if msg != "" && (!errors.As(err, &fe) || fe.Field != "prompt" || !strings.Contains(fe.Msg, msg)) {
			t.Errorf("%s: %v, want a prompt FieldError saying %q", in, err, msg)
		}
	}
}

// TestDecodePromptBound: a prompt over the bound is ErrPromptTooLong
// whatever follows its last allowed token; ids are read in one pass that
// allocates nothing per id past the bound; malformed arrays and long
// literals are errors that quote at most a few bytes.
func TestDecodePromptBound(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want error // nil: decodes
	}{
		{`[1,2,3]`, 3, nil}, {`[1,2,3]`, 2, ErrPromptTooLong}, {`[1,2,"x"]`, 2, ErrPromptTooLong},
		{`[1,2,-5]`, 2, ErrPromptTooLong}, {`[]`, 0, nil}, {`[1]`, 0, ErrPromptTooLong},
		{`"abc"`, 3, nil}, {`"abcd"`, 3, ErrPromptTooLong}, {" \n[ 7 ,\t8 ] ", 2, nil},
	} {
		p, err := DecodePrompt([]byte(c.in), c.max)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s bounded at %d: %+v, %v; want %v", c.in, c.max, p, err, c.want)
		}
	}
	for _, in := range []string{`[1,,2]`, `[1 2]`, `[1]x`, `[01]`, `[1,]`, "\v[1]", `[1`, `[-1]`, `[true]`, `{}`} {
		if p, err := DecodePrompt([]byte(in), -1); err == nil {
			t.Errorf("%q decodes to %+v", in, p)
		}
	}
	long := "[" + strings.Repeat("9", 1<<20) + "]"
	if _, err := DecodePrompt([]byte(long), -1); err == nil || len(err.Error()) > 120 || !strings.Contains(err.Error(), "token 0") {
		t.Errorf("a 1 MiB literal: %d bytes of error: %.200v", len(fmt.Sprint(err)), err)
	}
	ids := make([]string, 1<<16)
	for i := range ids {
		ids[i] = "5"
	}
	many := []byte("[" + strings.Join(ids, ",") + "]")
	allocs := testing.AllocsPerRun(10, func() {
		if _, err := DecodePrompt(many, 8); !errors.Is(err, ErrPromptTooLong) {
			t.Fatal(err)
		}
	})
	if allocs > 10 {
		t.Errorf("%d ids bounded at 8: %.0f allocations", len(ids), allocs)
	}
}

func TestTokenizer(t *testing.T) {
	toks := AppendBytesAsTokens(nil, "a\xffé")
	if len(toks) != 4 || toks[0] != 'a' || toks[1] != 0xff {
		t.Fatalf("tokens %v", toks)
	}
	var text []byte
	for _, id := range toks {
		text = AppendTokenText(text, id)
	}
	if string(text) != "a\xffé" {
		t.Fatalf("bytes do not round-trip: %q", text)
	}
	if got := string(AppendTokenText(nil, 300)); got != "\ufffd" {
		t.Fatalf("id 300 gives %q", got)
	}
}

func TestSaltOf(t *testing.T) {
	if SaltOf("", "") != 0 {
		t.Fatal("no tenant must be salt 0")
	}
	seen := map[uint64]string{}
	for _, p := range [][2]string{{"a", ""}, {"", "a"}, {"ab", "c"}, {"a", "bc"}, {"a", "b"}} {
		s := SaltOf(p[0], p[1])
		if s == 0 || seen[s] != "" {
			t.Fatalf("%q gives salt %d, seen for %q", p, s, seen[s])
		}
		seen[s] = p[0] + "|" + p[1]
		if SaltOf(p[0], p[1]) != s {
			t.Fatal("not deterministic")
		}
	}
}

func TestEventReader(t *testing.T) {
	in := ": comment\r\n" +
		"event: x\ndata: one\n\n" +
		"data:two\r\ndata: lines\r\n\r\n" +
		"\n\nid: 3\ndata: {\"a\":1}\n\n" +
		"data: [DONE]\n\n"
	r := NewEventReader(strings.NewReader(in))
	for _, want := range []string{"one", "two\nlines", `{"a":1}`, DoneData} {
		got, err := r.Next()
		if err != nil || string(got) != want {
			t.Fatalf("got %q, %v; want %q", got, err, want)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("at the end: %v", err)
	}
	r = NewEventReader(strings.NewReader("data: cut"))
	if _, err := r.Next(); err != io.ErrUnexpectedEOF {
		t.Fatalf("cut event: %v", err)
	}
	r = NewEventReader(strings.NewReader("data: a\rdata: b\n\n"))
	if _, err := r.Next(); err == nil || !strings.Contains(err.Error(), "lone CR") {
		t.Fatalf("lone CR: %v", err)
	}
	long := "data: " + strings.Repeat("x", 100<<10) + "\n\n"
	r = NewEventReader(strings.NewReader(long))
	if got, err := r.Next(); err != nil || len(got) != 100<<10 {
		t.Fatalf("long line: %d bytes, %v", len(got), err)
	}
	if got := string(AppendEvent(nil, []byte("x"))); got != "data: x\n\n" {
		t.Fatalf("AppendEvent: %q", got)
	}
}

// TestClientWholeResponse: a server that ignores stream and answers with
// one JSON response is read as one chunk.
func TestClientWholeResponse(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req CompletionRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !req.Stream || req.StreamOptions == nil {
			t.Errorf("request %+v, %v: want stream with include_usage", req, err)
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		io.WriteString(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ab","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`)
	}))
	defer srv.Close()
	res, err := (&Client{URL: srv.URL}).Complete(context.Background(), CompletionRequest{Prompt: TextPrompt("abc")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Text != "ab" || res.TokenCount != 1 || res.FinishReason != "stop" || res.Usage.CompletionTokens != 2 || res.TTFT <= 0 {
		t.Fatalf("%+v", res)
	}
}

// TestClientErrors: error statuses with and without an OpenAI error body,
// a stream cut before [DONE], and a chunk that is not JSON.
func TestClientErrors(t *testing.T) {
	cases := []struct {
		status int
		ctype  string
		body   string
		want   string
	}{
		{400, "application/json", `{"error":{"message":"max_tokens: bad","type":"invalid_request_error","param":"max_tokens","code":null}}`, "status 400: max_tokens: bad (param max_tokens)"},
		{502, "text/plain", "bad gateway\n", "status 502: bad gateway"},
		{200, "text/event-stream", "data: {\"choices\":[]}\n\n", "without [DONE]"},
		{200, "text/event-stream", "data: {nope\n\n", "stream chunk"},
		{200, "text/event-stream", "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}\n\n", "error event in the stream: boom"},
	}
	for _, c := range cases {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", c.ctype)
			w.WriteHeader(c.status)
			io.WriteString(w, c.body)
		}))
		_, err := (&Client{URL: srv.URL}).Complete(context.Background(), CompletionRequest{Prompt: TextPrompt("x")})
		srv.Close()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%d %q: %v, want %q", c.status, c.body, err, c.want)
		}
		if c.status != 200 && !IsStatus(err, c.status) {
			t.Errorf("IsStatus(%v, %d) is false", err, c.status)
		}
	}
}

// TestClientStreamWithoutIDs: a server that streams text without token ids
// (a plain OpenAI server) is counted one token per chunk that has text, and
// chunks with no text count none.
func TestClientStreamWithoutIDs(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, ": keep-alive\n\n"+
			"data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"finish_reason\":null}]}\n\n"+
			"data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":null}]}\n\n"+
			"data: {\"choices\":[{\"index\":0,\"text\":\"bc\",\"finish_reason\":\"length\"}]}\n\n"+
			"data: [DONE]\n\n")
	}))
	defer srv.Close()
	res, err := (&Client{URL: srv.URL}).Complete(context.Background(), CompletionRequest{Prompt: TextPrompt("x")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Text != "abc" || res.TokenCount != 2 || len(res.InterToken) != 1 || len(res.Tokens) != 0 ||
		res.FinishReason != "length" || res.Usage != nil {
		t.Fatalf("%+v", res)
	}
}
