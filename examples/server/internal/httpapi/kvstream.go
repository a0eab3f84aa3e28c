package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"kvtier.dev/kvtier"
)

// KVEvent is one event of GET /v1/kv/events, the data of a server-sent
// event whose id is Seq and whose event name is Kind. Keys and the salt are
// hexadecimal strings ("0x…"): JSON numbers lose 64-bit integers.
type KVEvent struct {
	Seq    uint64 `json:"seq"`
	Kind   string `json:"kind"` // BlockStored, BlockRemoved or TierCleared
	Tier   string `json:"tier"` // gpu, host, nvme or remote
	Key    string `json:"key,omitempty"`
	Parent string `json:"parent,omitempty"`
	Salt   string `json:"salt,omitempty"`
	// The block covers the prompt's tokens [FirstToken, FirstToken+NumTokens).
	FirstToken int     `json:"first_token"`
	NumTokens  int     `json:"num_tokens"`
	TokenIDs   []int32 `json:"token_ids,omitempty"`
}

// KVLost is the data of a "lost" server-sent event: the stream fell more
// than the manager's event ring behind and skipped events (the gap in the
// ids); Lost counts them since the stream began.
type KVLost struct {
	Lost uint64 `json:"lost"`
}

func hexKey(k uint64) string { return "0x" + strconv.FormatUint(k, 16) }

// kvEvents answers GET /v1/kv/events: the manager's events from ?from=N,
// or after the Last-Event-ID a reconnecting client sends, or from the next
// one; until the client goes away or the API drains.
func (a *API) kvEvents(w http.ResponseWriter, r *http.Request) {
	m := a.kv.Manager
	if m.EventStats().Buffer == 0 {
		kvFail(w, http.StatusNotFound, "", "the event stream is off (kvtier.Config.EventBuffer is 0)")
		return
	}
	from, err := eventsFrom(r)
	if err != nil {
		kvFail(w, http.StatusBadRequest, "from", err.Error())
		return
	}
	sub, err := m.Subscribe(from)
	if err != nil {
		kvFail(w, http.StatusBadRequest, "from", err.Error())
		return
	}
	defer sub.Close()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(a.streams, cancel)()

	flusher, _ := w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	var buf []byte
	lost := uint64(0)
	for {
		wait, stop := context.WithTimeout(ctx, kvHeartbeat)
		evs, err := sub.Next(wait)
		stop()
		buf = buf[:0]
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, context.DeadlineExceeded):
			buf = append(buf, ": keep-alive\n\n"...)
		case err != nil:
			return
		}
		if l := sub.Lost(); l != lost {
			lost = l
			buf = appendSSE(buf, "lost", 0, KVLost{Lost: lost})
		}
		for _, ev := range evs {
			buf = appendSSE(buf, ev.Kind.String(), ev.Seq, wireEvent(ev))
		}
		if _, err := w.Write(buf); err != nil {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
}

// eventsFrom is the first event a stream asks for: ?from, else one after
// Last-Event-ID, else 0 (the next event).
func eventsFrom(r *http.Request) (uint64, error) {
	if s := r.URL.Query().Get("from"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("from %q: want an event number (1, 2, ...)", s)
		}
		return n, nil
	}
	if s := r.Header.Get("Last-Event-ID"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("Last-Event-ID %q: want an event number", s)
		}
		return n + 1, nil
	}
	return 0, nil
}

func wireEvent(ev kvtier.BlockEvent) KVEvent {
	e := KVEvent{Seq: ev.Seq, Kind: ev.Kind.String(), Tier: ev.Tier.String(), FirstToken: ev.FirstToken,
		NumTokens: ev.NumTokens, TokenIDs: ev.Tokens}
	if ev.Kind != kvtier.TierCleared {
		e.Key, e.Parent, e.Salt = hexKey(uint64(ev.Key)), hexKey(uint64(ev.Parent)), hexKey(uint64(ev.Salt))
	}
	return e
}

// appendSSE appends one server-sent event (id omitted when 0).
func appendSSE(buf []byte, name string, id uint64, data any) []byte {
	if id != 0 {
		buf = append(buf, "id: "...)
		buf = strconv.AppendUint(buf, id, 10)
		buf = append(buf, '\n')
	}
	buf = append(buf, "event: "...)
	buf = append(buf, name...)
	buf = append(buf, "\ndata: "...)
	b, _ := json.Marshal(data) // plain fields: never fails
	buf = append(buf, b...)
	return append(buf, '\n', '\n')
}
