package httpapi

import (
	"fmt"
	"net/http"
	"time"

	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier"
)

// AdminPinRequest is the body of POST /admin/v1/pin: a prefix, its
// blocks' retention priority and how long it lasts (kvtier.Manager.Pin).
type AdminPinRequest struct {
	AdminPrefix
	// Priority is the retention priority in [0, 100] (kvtier.MaxPriority):
	// a tier evicts its lowest priority first; unpinned blocks are at 35
	// (kvtier.DefaultPriority). Absent: 100.
	Priority *int `json:"priority,omitempty"`
	// TTL is the pin's time limit as Go writes durations ("90s", "2h");
	// "" pins until /admin/v1/unpin.
	TTL string `json:"ttl,omitempty"`
}

// pin answers POST /admin/v1/pin: the cached blocks of the prefix get the
// priority, so that their tiers evict them only once no block of a lower
// priority is evictable there, until the TTL passes or an unpin.
func (ad *admin) pin(r *http.Request, body []byte) adminReply {
	var req AdminPinRequest
	if err := decodeAdmin(body, &req); err != nil {
		return adminError(err)
	}
	prio := kvtier.MaxPriority
	if req.Priority != nil {
		if prio = *req.Priority; prio < 0 || prio > kvtier.MaxPriority {
			return adminError(&openai.FieldError{Field: "priority", Msg: fmt.Sprintf("%d: want 0 to %d", prio, kvtier.MaxPriority)})
		}
	}
	var until time.Time
	if req.TTL != "" {
		ttl, err := time.ParseDuration(req.TTL)
		if err != nil || ttl <= 0 {
			return adminError(&openai.FieldError{Field: "ttl", Msg: fmt.Sprintf("%q: want a positive duration such as 90s or 2h, or none", clip(req.TTL))})
		}
		until = time.Now().Add(ttl)
	}
	toks, keys, err := ad.prefix(&req.AdminPrefix)
	if err != nil {
		return adminError(err)
	}
	m, salt := ad.a.kv.Manager, ad.salt(req.User, req.Salt)
	var n int
	if keys != nil {
		n, err = m.PinKeys(salt, keys, prio, until)
	} else {
		n, err = m.Pin(salt, toks, prio, until)
	}
	if err != nil {
		return adminError(err)
	}
	return adminReply{http.StatusOK, AdminBlocks{Blocks: n}, []any{"tenant", req.User + "/" + req.Salt, "tokens", len(toks), "keys", len(keys), "priority", prio, "ttl", req.TTL, "blocks", n}}
}

// unpin answers POST /admin/v1/unpin: the blocks of the prefix that were
// pinned are not any more.
func (ad *admin) unpin(r *http.Request, body []byte) adminReply {
	return ad.onPrefix(body, (*kvtier.Manager).UnpinKeys, (*kvtier.Manager).Unpin)
}
