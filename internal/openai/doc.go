// Package openai is the wire format of the OpenAI completions API subset that
// kvtier's model server speaks and that `kvtier bench-serve` sends: the
// request and response bodies, the usage with cached tokens split per tier,
// the byte-level tokenizer, server-sent events, and a streaming client that
// times the first token and the gaps between tokens.
//
// # The subset
//
// POST /v1/completions with a CompletionRequest: prompt as a string or as an
// array of token ids (one prompt; batches are not supported), max_tokens,
// stream (with stream_options.include_usage), user and salt. Decoding is
// greedy: temperature, when given, is 0.
//
// Fields beyond OpenAI's, each optional, so that a plain OpenAI client and a
// vLLM or SGLang server still interoperate with ours:
//
//   - salt (string): separates tenants. The server hashes user and salt
//     together (SaltOf) into kvtier's salt: two requests share cached KV only
//     when both fields are equal. vLLM's equivalent is cache_salt.
//   - no_cache (bool): the server neither reads nor writes its KV cache for
//     this request: every prompt token is prefilled, nothing is inserted. It
//     is how `bench-serve --verify` gets a reference answer to compare a
//     cached one against. A server that ignores the field still answers, but
//     from its cache, so a verify run against it checks less.
//   - return_token_ids (bool): each choice (and each streamed chunk) carries
//     the generated token ids in token_ids, as vLLM's field of that name.
//     Our server always sends them.
//   - usage.prompt_tokens_details.cached_tokens_by_tier and recomputed_tokens
//     (see PromptTokensDetails).
//
// # Errors
//
// An error response is OpenAI's {"error": {"message", "type", "param",
// "code"}}; param names the request field that was wrong.
//
// This package imports none of kvtier's packages.
package openai
