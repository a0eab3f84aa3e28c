package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier"
)

// The operator's routes, served by the handler API.Admin returns (on a
// listener of their own), each behind "Authorization: Bearer <token>":
//
//	POST /admin/v1/evict              move a prefix's blocks out of the tiers
//	                                  faster than "keep" (kvtier.Manager.Evict)
//	POST /admin/v1/invalidate         forget a prefix's blocks in every tier,
//	                                  the remote's too (kvtier.Manager.Invalidate,
//	                                  remotetier.Tier.Invalidate)
//	POST /admin/v1/invalidate-tenant  forget every block of a tenant, and those
//	                                  of its blocks this server knows the remote
//	                                  holds (kvtier.Manager.InvalidateSalt,
//	                                  remotetier.Tier.InvalidateSalt)
//	POST /admin/v1/pin                give a prefix's blocks a retention
//	                                  priority, with a TTL or until unpinned
//	                                  (kvtier.Manager.Pin)
//	POST /admin/v1/unpin              end a prefix's pin (kvtier.Manager.Unpin)
//	POST /admin/v1/flush              write every block down to the slowest
//	                                  tier (kvtier.Manager.Flush)
//	POST /admin/v1/drain              begin the server's drain, as SIGTERM
//	GET  /admin/v1/tiers              each tier's capacity, resident and
//	                                  in-use blocks (kvtier.Manager.Metrics),
//	                                  the pinned blocks, each tenant's share
//
// A prefix is {"prompt": text or ids} or {"keys": ["0x…", …]} (the block
// keys of its leading blocks in order, as /v1/kv/events announces them),
// with the tenant's "user" and "salt" as a completion gives them; the
// tenant's salt is folded as the engine folds it (KV.Salt). A missing or
// wrong token gets 401, bad input 400 naming the field; every call is
// logged (remote address, route, status, result).

// AdminPath is the prefix of the operator's routes.
const AdminPath = "/admin/v1/"

// AdminConfig configures the operator's routes.
type AdminConfig struct {
	// Token is the bearer token a call must present (required).
	Token []byte
	// Flush writes the cache down (nil: Manager.Flush of Config.KV's).
	Flush func(context.Context) error
	// Drain begins the server's drain and returns at once (required).
	Drain func()
	// Logger logs every call (nil: slog.Default()).
	Logger *slog.Logger
}

// admin serves the operator's routes.
type admin struct {
	a     *API
	sum   [sha256.Size]byte // of the token: compared in constant time
	flush func(context.Context) error
	drain func()
	log   *slog.Logger
	mux   *http.ServeMux
}

// adminReply is a route's answer: its status and body, and what the log
// says of it.
type adminReply struct {
	status int
	body   any
	attrs  []any
}

// Admin returns the handler of the operator's routes over the API's cache
// (Config.KV, which it requires).
func (a *API) Admin(c AdminConfig) (http.Handler, error) {
	switch {
	case a.kv == nil:
		return nil, errors.New("httpapi: Admin needs Config.KV")
	case len(c.Token) == 0:
		return nil, errors.New("httpapi: AdminConfig.Token is empty")
	case c.Drain == nil:
		return nil, errors.New("httpapi: AdminConfig.Drain is nil")
	}
	ad := &admin{a: a, sum: sha256.Sum256(c.Token), flush: c.Flush, drain: c.Drain, log: c.Logger, mux: http.NewServeMux()}
	if ad.flush == nil {
		ad.flush = a.kv.Manager.Flush
	}
	if ad.log == nil {
		ad.log = slog.Default()
	}
	for _, r := range []struct {
		route string
		h     func(*http.Request, []byte) adminReply
	}{
		{"POST " + AdminPath + "evict", ad.evict},
		{"POST " + AdminPath + "invalidate", ad.invalidate},
		{"POST " + AdminPath + "invalidate-tenant", ad.invalidateTenant},
		{"POST " + AdminPath + "pin", ad.pin},
		{"POST " + AdminPath + "unpin", ad.unpin},
		{"POST " + AdminPath + "flush", ad.flushAll},
		{"POST " + AdminPath + "drain", ad.drainServer},
		{"GET " + AdminPath + "tiers", ad.tiers},
	} {
		ad.mux.Handle(r.route, ad.call(r.h))
	}
	return ad, nil
}

// ServeHTTP checks the token, then serves the route (404 and 405 for no
// route, after the token).
func (ad *admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	sum := sha256.Sum256([]byte(tok))
	if !ok || subtle.ConstantTimeCompare(sum[:], ad.sum[:]) != 1 {
		ad.log.Warn("admin: refused", "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path, "status", http.StatusUnauthorized,
			"why", map[bool]string{true: "wrong bearer token", false: "no bearer token"}[ok])
		w.Header().Set("WWW-Authenticate", `Bearer realm="kvtier admin"`)
		kvFail(w, http.StatusUnauthorized, "Authorization", "a bearer token (Authorization: Bearer <the -admin-token-file's>) is missing or wrong")
		return
	}
	ad.mux.ServeHTTP(w, r)
}

// call reads a route's body (at most the API's MaxBodyBytes), runs it,
// writes its reply and logs the call.
func (ad *admin) call(h func(*http.Request, []byte) adminReply) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, ad.a.maxBodyBytes))
		var rep adminReply
		if err != nil {
			rep = adminError(&openai.FieldError{Field: "body", Msg: err.Error()})
		} else {
			rep = h(r, body)
		}
		attrs := append([]any{"remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path, "status", rep.status}, rep.attrs...)
		if e, ok := rep.body.(openai.ErrorResponse); ok {
			attrs = append(attrs, "err", e.Error.Message)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rep.status)
		json.NewEncoder(w).Encode(rep.body)
		ad.log.Info("admin: call", attrs...)
	})
}

// adminError is the reply of a failed call: 400 naming the field of a
// *openai.FieldError, 500 for anything else.
func adminError(err error) adminReply {
	status, typ := http.StatusInternalServerError, openai.ErrServer
	e := openai.ErrorResponse{Error: openai.ErrorBody{Message: err.Error()}}
	var fe *openai.FieldError
	if errors.As(err, &fe) {
		status, typ = http.StatusBadRequest, openai.ErrInvalidRequest
		e.Error.Param = &fe.Field
	}
	e.Error.Type = typ
	return adminReply{status: status, body: e}
}

// AdminPrefix names a tenant's prefix: Prompt or Keys, not both.
type AdminPrefix struct {
	Prompt *openai.Prompt `json:"prompt,omitempty"`
	Keys   []string       `json:"keys,omitempty"`
	User   string         `json:"user,omitempty"`
	Salt   string         `json:"salt,omitempty"`
}

// AdminEvictRequest is the body of POST /admin/v1/evict.
type AdminEvictRequest struct {
	AdminPrefix
	// Keep is the tier the blocks stay in ("host", "nvme"; "" is "host"):
	// they leave every faster one.
	Keep string `json:"keep,omitempty"`
}

// AdminTenant is the body of POST /admin/v1/invalidate-tenant.
type AdminTenant struct {
	User string `json:"user,omitempty"`
	Salt string `json:"salt,omitempty"`
}

// AdminBlocks is the answer of the evict and invalidate routes: the blocks
// the call took out or forgot, and, with a remote tier, the blocks
// /admin/v1/invalidate deleted there.
type AdminBlocks struct {
	Blocks       int `json:"blocks"`
	RemoteBlocks int `json:"remote_blocks,omitempty"`
}

// decodeAdmin decodes body into v: one JSON object of v's fields only.
func decodeAdmin(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return bodyError(err, body)
	}
	if _, err := dec.Token(); err != io.EOF {
		return &openai.FieldError{Field: "body", Msg: "more after the request's JSON object"}
	}
	return nil
}

// salt is the cache's salt of a tenant, as the engine keys its blocks.
func (ad *admin) salt(user, salt string) kvtier.Salt {
	s := kvtier.Salt(openai.SaltOf(user, salt))
	if ad.a.kv.Salt != nil {
		s = ad.a.kv.Salt(s)
	}
	return s
}

// prefix is p's tokens or keys (one of them), or a *openai.FieldError.
func (ad *admin) prefix(p *AdminPrefix) (toks []int32, keys []kvtier.Key, err error) {
	switch {
	case p.Prompt != nil && p.Keys != nil:
		return nil, nil, &openai.FieldError{Field: "keys", Msg: "give a prompt or keys, not both"}
	case p.Prompt != nil:
		toks, err = ad.a.promptTokens(*p.Prompt)
		return toks, nil, err
	case len(p.Keys) == 0:
		return nil, nil, &openai.FieldError{Field: "prompt", Msg: "missing: give a prompt (text or token ids) or keys"}
	case len(p.Keys) > ad.a.limits.ContextTokens:
		return nil, nil, &openai.FieldError{Field: "keys", Msg: fmt.Sprintf("%d keys, more than the blocks of the model's context of %d tokens", len(p.Keys), ad.a.limits.ContextTokens)}
	}
	keys = make([]kvtier.Key, len(p.Keys))
	for i, s := range p.Keys {
		hex, ok := strings.CutPrefix(s, "0x")
		k, err := strconv.ParseUint(hex, 16, 64)
		if !ok || err != nil {
			return nil, nil, &openai.FieldError{Field: "keys", Msg: fmt.Sprintf("key %d is %q, not a block key in hex (0x…, as /v1/kv/events writes them)", i, clip(s))}
		}
		keys[i] = kvtier.Key(k)
	}
	return nil, keys, nil
}

// evict answers POST /admin/v1/evict.
func (ad *admin) evict(r *http.Request, body []byte) adminReply {
	var req AdminEvictRequest
	if err := decodeAdmin(body, &req); err != nil {
		return adminError(err)
	}
	keep := kvtier.Host
	switch req.Keep {
	case "", "host":
	case "nvme":
		keep = kvtier.NVMe
	default:
		return adminError(&openai.FieldError{Field: "keep", Msg: fmt.Sprintf("%q: want host or nvme", clip(req.Keep))})
	}
	m := ad.a.kv.Manager
	if m.CapacitySlots(keep) == 0 {
		return adminError(&openai.FieldError{Field: "keep", Msg: fmt.Sprintf("this server has no %v tier", keep)})
	}
	toks, keys, err := ad.prefix(&req.AdminPrefix)
	if err != nil {
		return adminError(err)
	}
	salt := ad.salt(req.User, req.Salt)
	var n int
	if keys != nil {
		n, err = m.EvictKeys(r.Context(), salt, keys, keep)
	} else {
		n, err = m.Evict(r.Context(), salt, toks, keep)
	}
	if err != nil {
		return adminError(err)
	}
	return adminReply{http.StatusOK, AdminBlocks{Blocks: n}, []any{"tenant", req.User + "/" + req.Salt, "tokens", len(toks), "keys", len(keys), "keep", keep.String(), "blocks", n}}
}

// invalidate answers POST /admin/v1/invalidate: the prefix's blocks are
// forgotten in every tier of the manager and deleted from the remote tier.
func (ad *admin) invalidate(r *http.Request, body []byte) adminReply {
	rep := ad.onPrefix(body, (*kvtier.Manager).InvalidateKeys, (*kvtier.Manager).Invalidate)
	del := ad.a.kv.InvalidateRemote
	if rep.status != http.StatusOK || del == nil {
		return rep
	}
	req, toks, keys, err := ad.decodePrefix(body)
	if err != nil {
		return adminError(err)
	}
	if keys == nil {
		h, err := kvtier.NewHasher(ad.a.kv.Manager.BlockTokens())
		if err != nil {
			return adminError(err)
		}
		keys = h.AppendKeys(nil, ad.salt(req.User, req.Salt), 0, toks)
	}
	n, err := del(r.Context(), keys)
	return ad.withRemote(rep, n, err)
}

// withRemote adds to rep (AdminBlocks) the blocks a call deleted from the
// remote tier, and the error of those it could not.
func (ad *admin) withRemote(rep adminReply, n int, err error) adminReply {
	out := rep.body.(AdminBlocks)
	out.RemoteBlocks = n
	rep.body, rep.attrs = out, append(rep.attrs, "remote_blocks", n)
	if err != nil {
		ad.log.Warn("admin: the remote tier refused deletes", "err", err)
		rep.attrs = append(rep.attrs, "remote_err", err.Error())
	}
	return rep
}

// decodePrefix decodes a body that names a prefix, and returns its tokens
// or its keys.
func (ad *admin) decodePrefix(body []byte) (req AdminPrefix, toks []int32, keys []kvtier.Key, err error) {
	if err := decodeAdmin(body, &req); err != nil {
		return req, nil, nil, err
	}
	toks, keys, err = ad.prefix(&req)
	return req, toks, keys, err
}

// onPrefix answers a call on the prefix body names, by its keys or its
// tokens, with the blocks the call counted.
func (ad *admin) onPrefix(body []byte, byKeys func(*kvtier.Manager, kvtier.Salt, []kvtier.Key) (int, error),
	byTokens func(*kvtier.Manager, kvtier.Salt, []int32) (int, error)) adminReply {
	req, toks, keys, err := ad.decodePrefix(body)
	if err != nil {
		return adminError(err)
	}
	m, salt := ad.a.kv.Manager, ad.salt(req.User, req.Salt)
	var n int
	if keys != nil {
		n, err = byKeys(m, salt, keys)
	} else {
		n, err = byTokens(m, salt, toks)
	}
	if err != nil {
		return adminError(err)
	}
	return adminReply{http.StatusOK, AdminBlocks{Blocks: n}, []any{"tenant", req.User + "/" + req.Salt, "tokens", len(toks), "keys", len(keys), "blocks", n}}
}

// invalidateTenant answers POST /admin/v1/invalidate-tenant.
func (ad *admin) invalidateTenant(r *http.Request, body []byte) adminReply {
	var req AdminTenant
	if err := decodeAdmin(body, &req); err != nil {
		return adminError(err)
	}
	salt := ad.salt(req.User, req.Salt)
	n := ad.a.kv.Manager.InvalidateSalt(salt)
	rep := adminReply{http.StatusOK, AdminBlocks{Blocks: n}, []any{"tenant", req.User + "/" + req.Salt, "blocks", n}}
	if del := ad.a.kv.InvalidateRemoteSalt; del != nil {
		m, err := del(r.Context(), salt)
		return ad.withRemote(rep, m, err)
	}
	return rep
}

// AdminStatus is the answer of the flush and drain routes.
type AdminStatus struct {
	Status string `json:"status"`
}

// noBody refuses a body on a route that takes none.
func noBody(body []byte) error {
	if len(bytes.TrimSpace(body)) > 0 && string(bytes.TrimSpace(body)) != "{}" {
		return &openai.FieldError{Field: "body", Msg: "this route takes no body (or {})"}
	}
	return nil
}

// flushAll answers POST /admin/v1/flush: 200 once every block is written
// down, 507 when some found no slot (kvtier.ErrNoSpace).
func (ad *admin) flushAll(r *http.Request, body []byte) adminReply {
	if err := noBody(body); err != nil {
		return adminError(err)
	}
	err := ad.flush(r.Context())
	if errors.Is(err, kvtier.ErrNoSpace) {
		rep := adminError(err)
		rep.status = http.StatusInsufficientStorage
		return rep
	}
	if err != nil {
		return adminError(err)
	}
	return adminReply{http.StatusOK, AdminStatus{"flushed"}, nil}
}

// drainServer answers POST /admin/v1/drain: 202, the drain begun.
func (ad *admin) drainServer(r *http.Request, body []byte) adminReply {
	if err := noBody(body); err != nil {
		return adminError(err)
	}
	ad.drain()
	return adminReply{http.StatusAccepted, AdminStatus{"draining"}, nil}
}

// AdminTier is one tier's state in GET /admin/v1/tiers.
type AdminTier struct {
	CapacitySlots  int64  `json:"capacity_slots"`
	ResidentBlocks int64  `json:"resident_blocks"`
	InUseBlocks    int64  `json:"in_use_blocks"`
	Hits           uint64 `json:"hits"`
	Misses         uint64 `json:"misses"`
	Evictions      uint64 `json:"evictions"`
}

// AdminTiers is the answer of GET /admin/v1/tiers: one entry per tier
// present ("gpu", "host", "nvme"), and the blocks the manager knows.
type AdminTiers struct {
	Tiers         map[string]AdminTier `json:"tiers"`
	Records       int64                `json:"records"`
	Invalidations uint64               `json:"invalidations"`
	// PinnedBlocks are the blocks pinned now (POST /admin/v1/pin), and
	// PinnedByPriority those at each priority that has some.
	PinnedBlocks     int         `json:"pinned_blocks"`
	PinnedByPriority map[int]int `json:"pinned_by_priority,omitempty"`
	// Tenants, with -tenant-quota, are each configured tenant's blocks and
	// caps per tier, and "other" for the rest, by name.
	Tenants map[string]AdminTenantState `json:"tenants,omitempty"`
}

// AdminTenantState is one tenant's share of the tiers: resident blocks and
// cap (0: none) by tier name.
type AdminTenantState struct {
	Weight         float64          `json:"weight"`
	ResidentBlocks map[string]int64 `json:"resident_blocks"`
	CapSlots       map[string]int64 `json:"cap_slots,omitempty"`
}

// tiers answers GET /admin/v1/tiers.
func (ad *admin) tiers(r *http.Request, body []byte) adminReply {
	if err := noBody(body); err != nil {
		return adminError(err)
	}
	m := ad.a.kv.Manager
	mt := m.Metrics()
	out := AdminTiers{Tiers: map[string]AdminTier{}, Records: mt.Records, Invalidations: mt.Invalidations}
	for t := range kvtier.NumTiers {
		if m.CapacitySlots(t) == 0 {
			continue
		}
		tm := mt.Tiers[t]
		out.Tiers[t.String()] = AdminTier{CapacitySlots: int64(m.CapacitySlots(t)), ResidentBlocks: tm.ResidentBlocks, InUseBlocks: tm.InUseBlocks,
			Hits: tm.Hits, Misses: tm.Misses, Evictions: tm.Evictions}
	}
	for p, n := range m.PinnedAt() {
		if n > 0 {
			if out.PinnedByPriority == nil {
				out.PinnedByPriority = map[int]int{}
			}
			out.PinnedByPriority[p] = n
			out.PinnedBlocks += n
		}
	}
	for _, tm := range m.TenantMetrics() {
		if out.Tenants == nil {
			out.Tenants = map[string]AdminTenantState{}
		}
		st := AdminTenantState{Weight: tm.Weight, ResidentBlocks: map[string]int64{}}
		for t := range kvtier.NumTiers {
			if m.CapacitySlots(t) == 0 {
				continue
			}
			st.ResidentBlocks[t.String()] = tm.Tiers[t].ResidentBlocks
			if c := tm.Tiers[t].CapSlots; c > 0 {
				if st.CapSlots == nil {
					st.CapSlots = map[string]int64{}
				}
				st.CapSlots[t.String()] = c
			}
		}
		out.Tenants[tm.Name] = st
	}
	return adminReply{http.StatusOK, out, nil}
}
