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
// Status codes: 400 names the bad field in the error's param (including a
// prompt longer than the model's context, or prompt plus max_tokens over
// it); 413 for a body over Config.MaxBodyBytes; 429 when the engine's queue
// is full (Backend.Submit returns ErrQueueFull); 503 while draining; 500 when
// the engine fails a request before its first token (after it, the stream
// ends with an error event instead, the status being sent).
//
// A server wires it as follows (engine implements Backend; mgr is the
// kvtier.Manager):
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(kvprom.New(mgr, "kvtier", nil))
//	api, err := httpapi.New(httpapi.Config{Backend: engine, Registry: reg})
//	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: api}
//	go srv.ListenAndServe()
//	<-sigterm
//	api.Drain(ctx)    // answer what is in flight, refuse the rest
//	srv.Shutdown(ctx) // close the listener and idle connections
//	engine.Close()    // finish write-backs, close the NVMe store
//
// The package promises that every request handed to the engine ends (the
// engine calls Stream.Finish) before Drain returns, and that no request is
// handed to the engine once Drain began.
package httpapi
