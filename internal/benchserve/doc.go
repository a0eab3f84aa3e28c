// Package benchserve replays a request trace against an OpenAI-compatible
// completions endpoint and measures what a client sees: time to first
// token, inter-token latency, throughput, errors by status, and the cached
// prompt tokens per tier that the server reports. It is the engine of
// `kvtier bench-serve`; the command parses flags into a Config.
//
// # Prompts from a trace
//
// A trace gives prefix-chained block keys, not text. Block i of a request
// becomes a run of token ids drawn from a generator seeded by its key and
// salt, so two requests that share blocks 0..i in the trace send the same
// first tokens, and the server's prefix cache sees the trace's sharing.
// Traces that carry token ids (native format) send them as they are.
//
// # Load
//
// Requests arrive at the trace's times divided by Config.Speed (open
// loop: a slow server does not slow the arrivals), or, with
// Config.Concurrency N, N clients each send their next request as soon as
// the last is answered (closed loop). Requests are streamed and greedy.
//
// # Verification
//
// With Config.Verify N, every Nth request (the Nth, 2Nth, ...) is sent
// again once answered, with "no_cache": true (internal/openai): the server
// computes it without its KV cache, and the two answers' token ids must be
// equal. A difference means served KV was wrong (or the server is not
// deterministic); each one is counted and the first few are listed. A
// first difference where each answer's token beat the other's by at most
// Config.VerifyTolerance is a near tie, counted apart (TieGap, NearTie).
// The report gives the agreement over all compared answers and over those
// that reused cached tokens, with the tokens compared and the cached range.
//
// The package promises that the prompts are a pure function of the trace,
// Config.Vocab, Seed, BlockTokens and MaxPromptTokens: the same flags send
// the same requests to every server.
package benchserve
