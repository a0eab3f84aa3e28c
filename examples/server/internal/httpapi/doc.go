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
//
// Status codes: 400 names the bad field in the error's param (including a
// prompt longer than the model's context, or prompt plus max_tokens over
// it); 413 for a body over Config.MaxBodyBytes; 429 when the engine's queue
// is full (Backend.Submit returns ErrQueueFull); 503 while draining; 500 when
// the engine fails a request before its first token (after it, the stream
// ends with an error event instead, the status being sent).
//
// The package promises that every request handed to the engine ends (the
// engine calls Stream.Finish) before Drain returns, and that no request is
// handed to the engine once Drain began.
package httpapi
