package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier"
)

// The /v1/kv routes show the cache to what routes requests to this server:
//
//	POST /v1/kv/lookup   how many of a prompt's tokens each tier holds now
//	                     (kvtier.Manager.CachedPrefix: no lease, no policy
//	                     touch): {"prompt": text or ids, "user", "salt"}
//	GET  /v1/kv/events   the manager's events as server-sent events (id: the
//	                     event's Seq; ?from=N or Last-Event-ID resumes)
//
// The remote tier is not asked: a lookup is local and takes microseconds.

// KV configures the /v1/kv routes.
type KV struct {
	// Manager is the server's block manager; /v1/kv/events needs its
	// event stream (kvtier.Config.EventBuffer).
	Manager *kvtier.Manager
	// LookupTokens, when set, is how many leading tokens of an n-token
	// prompt the engine looks up in the cache (an engine that always
	// computes the block of the last position looks up fewer): the lookup
	// asks about those. Nil: all n.
	LookupTokens func(n int) int
	// Salt, when set, is the salt the cache keys a tenant's blocks under
	// (a server folds its model's identity into the tenant's); nil: the
	// tenant's own.
	Salt func(kvtier.Salt) kvtier.Salt
	// InvalidateRemote, when set, deletes blocks by key from the shared
	// remote tier (remotetier.Tier.Invalidate) and returns how many:
	// POST /admin/v1/invalidate forgets a prefix there too, or a server
	// would fetch back what it was told to forget.
	InvalidateRemote func(ctx context.Context, keys []kvtier.Key) (int, error)
	// InvalidateRemoteSalt, when set, deletes a salt's blocks that this
	// server knows the remote tier holds (remotetier.Tier.InvalidateSalt),
	// for POST /admin/v1/invalidate-tenant.
	InvalidateRemoteSalt func(ctx context.Context, salt kvtier.Salt) (int, error)
}

// KVPath is the prefix of the /v1/kv routes.
const KVPath = "/v1/kv/"

// kvHeartbeat is how often an idle event stream writes a comment, so that
// proxies keep the connection.
const kvHeartbeat = 15 * time.Second

// kvRoutes registers the /v1/kv routes on a's mux.
func (a *API) kvRoutes(kv *KV) error {
	if kv.Manager == nil {
		return errors.New("httpapi: Config.KV.Manager is nil")
	}
	a.kv = kv
	a.mux.HandleFunc("POST "+KVPath+"lookup", a.kvLookup)
	a.mux.HandleFunc("GET "+KVPath+"events", a.kvEvents)
	return nil
}

// KVLookupRequest is the body of POST /v1/kv/lookup.
type KVLookupRequest struct {
	Prompt openai.Prompt `json:"prompt"`
	// User and Salt select the tenant, as in a completion request.
	User string `json:"user,omitempty"`
	Salt string `json:"salt,omitempty"`
}

// KVLookupResponse is the answer of POST /v1/kv/lookup.
type KVLookupResponse struct {
	PromptTokens int `json:"prompt_tokens"`
	// LookedUpTokens are the prompt's tokens the engine looks up (the
	// others it always computes), and CachedTokens those of them the next
	// request with this prompt would load, if nothing changes before.
	LookedUpTokens int `json:"looked_up_tokens"`
	CachedTokens   int `json:"cached_tokens"`
	// Tiers has one entry per tier present ("gpu", "host", "nvme").
	Tiers map[string]KVTierTokens `json:"tiers"`
	// TookMicros is the query's time in the manager.
	TookMicros float64 `json:"took_us"`
}

// KVTierTokens is one tier's part of a lookup.
type KVTierTokens struct {
	// CachedTokens are the tokens the next request would load from this
	// tier (its fastest copy of them); PrefixTokens the longest run of
	// leading tokens the tier holds, whatever faster tiers hold.
	CachedTokens int `json:"cached_tokens"`
	PrefixTokens int `json:"prefix_tokens"`
}

// kvLookup answers POST /v1/kv/lookup.
func (a *API) kvLookup(w http.ResponseWriter, r *http.Request) {
	var req *KVLookupRequest
	var toks []int32
	err := a.readBounded(w, r, func(body []byte) (err error) {
		req, toks, err = a.decodeKVLookup(body)
		return err
	})
	if err != nil {
		a.failRequest(w, err)
		return
	}
	n := len(toks)
	if a.kv.LookupTokens != nil {
		n = min(max(a.kv.LookupTokens(n), 0), n)
	}
	m := a.kv.Manager
	t0 := time.Now()
	salt := kvtier.Salt(openai.SaltOf(req.User, req.Salt))
	if a.kv.Salt != nil {
		salt = a.kv.Salt(salt)
	}
	p := m.CachedPrefix(salt, toks[:n])
	took := time.Since(t0)
	resp := KVLookupResponse{PromptTokens: len(toks), LookedUpTokens: n, CachedTokens: p.CachedTokens(),
		Tiers: map[string]KVTierTokens{}, TookMicros: float64(took.Nanoseconds()) / 1e3}
	for t := range kvtier.NumTiers {
		if m.CapacitySlots(t) > 0 {
			resp.Tiers[t.String()] = KVTierTokens{CachedTokens: p.Cached[t], PrefixTokens: p.Prefix[t]}
		}
	}
	body, err := json.Marshal(&resp)
	if err != nil {
		kvFail(w, http.StatusInternalServerError, "", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

// decodeKVLookup reads a lookup request and returns its prompt's tokens, or
// a *openai.FieldError naming what is wrong.
func (a *API) decodeKVLookup(body []byte) (*KVLookupRequest, []int32, error) {
	var req KVLookupRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, nil, bodyError(err, body)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, &openai.FieldError{Field: "body", Msg: "more after the request's JSON object"}
	}
	toks, err := a.promptTokens(req.Prompt)
	if err != nil {
		return nil, nil, err
	}
	return &req, toks, nil
}

// promptTokens are a /v1/kv or admin request's prompt as the engine's
// tokens, or a *openai.FieldError naming the prompt.
func (a *API) promptTokens(p openai.Prompt) ([]int32, error) {
	bad := func(format string, args ...any) error {
		return &openai.FieldError{Field: "prompt", Msg: fmt.Sprintf(format, args...)}
	}
	lim := a.limits
	var toks []int32
	if p.IsTokens {
		toks = p.Tokens
		for i, t := range toks {
			if int(t) >= lim.VocabSize {
				return nil, bad("token %d is id %d, outside the model's vocabulary of %d", i, t, lim.VocabSize)
			}
		}
	} else {
		if lim.VocabSize < openai.ByteVocab {
			return nil, bad("text prompts are byte-level tokens and need a vocabulary of %d ids; this model has %d: send token ids", openai.ByteVocab, lim.VocabSize)
		}
		toks = openai.AppendBytesAsTokens(make([]int32, 0, len(p.Text)), p.Text)
	}
	switch {
	case len(toks) == 0:
		return nil, bad("missing or empty")
	case len(toks) > lim.ContextTokens:
		return nil, bad("%d tokens, longer than the model's context of %d", len(toks), lim.ContextTokens)
	}
	return toks, nil
}

// kvFail writes an error in the completions' format, without counting it
// among the completions' answers.
func kvFail(w http.ResponseWriter, status int, param, msg string) {
	typ := openai.ErrInvalidRequest
	if status >= 500 {
		typ = openai.ErrServer
	}
	writeError(w, status, typ, param, msg)
}
