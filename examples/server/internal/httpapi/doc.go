// Package httpapi is the HTTP front of kvtier's model server: the
// OpenAI-style completions endpoint (wire types in internal/openai),
// Prometheus metrics and a health check, over a Backend that a model engine
// implements. It knows nothing of the model: it decodes and checks requests,
// hands them to the engine, streams the tokens the engine produces, reports
// usage per kvtier tier, and drains in-flight requests on shutdown.
//
// Routes:
//
//	POST /v1/completions   a completion, whole or streamed (server-sent events)
//	GET  /metrics          Prometheus text: the server's series (kvserve_*) and
//	                       whatever else the caller registers (kvtier's kvprom)
//	GET  /healthz          200 "ok", or 503 "draining" once Drain began
//	POST /v1/kv/lookup     how much of a prompt each kvtier tier holds now
//	GET  /v1/kv/events     kvtier's block events as server-sent events
//	                       (both with Config.KV; see kv.go)
//
// API.Admin is the operator's handler, for a listener of its own: evict,
// invalidate, flush, drain and the tiers' state under /admin/v1/, behind a
// bearer token (see admin.go).
//
// Status codes: 400 names the bad field in the error's param (including a
// prompt longer than the model's context, or prompt plus max_tokens over
// it); 408 for a body not in within Config.BodyTimeout; 413 for a body over
// Config.MaxBodyBytes (by default derived from the model's context); 429
// when the engine's queue is full (Backend.Submit returns ErrQueueFull);
// 503 while draining; 500 when the engine fails a request before its first
// token (after it, the stream ends with an error event instead, the status
// being sent). A client that went away gets no answer: its connection is
// aborted. Errors quote at most a few dozen bytes of what the client sent.
//
// What a client can make the server hold is bounded: a body's bytes by
// Config.MaxBodyBytes, the bodies read at once by Config.MaxDecodes (the
// others wait before a byte is read), the time to send a body and to take
// each write of the answer by Config.BodyTimeout and WriteTimeout, and the
// connections open by LimitListener.
//
// A server wires it as follows (engine implements Backend; mgr is the
// kvtier.Manager):
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(kvprom.New(mgr, "kvtier", nil))
//	api, err := httpapi.New(httpapi.Config{Backend: engine, Registry: reg})
//	ln, err := net.Listen("tcp", "127.0.0.1:8080")
//	srv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
//	go srv.Serve(httpapi.LimitListener(ln, 1024))
//	<-sigterm
//	api.Drain(ctx)    // answer what is in flight, refuse the rest
//	srv.Shutdown(ctx) // close the listener and idle connections
//	engine.Close()    // finish write-backs, close the NVMe store
//
// The package promises that every request handed to the engine ends (the
// engine calls Stream.Finish) before Drain returns, and that no request is
// handed to the engine once Drain began. A request is in flight from the
// end of its decoding: Drain does not wait for a body still coming (its
// read ends, 503).
package httpapi
