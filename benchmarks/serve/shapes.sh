#!/usr/bin/env bash
# The first-pass cost of a new shape: one gpu-only server per variant
# replays shapes-trace.jsonl (the same 2,007-token prompt 50 times, at 1 s,
# then 30 ms, then 300 ms apart: every request after the first computes
# its last 7 tokens after 2,000 on the GPU), and bench-serve records each
# request's TTFT. The second request is the first pass of its shape; the
# ones after it repeat it. Variants: "exact" (-exact-rows: products at the
# pass's own rows, no warm-up) and "buckets" (the default: rows padded to
# their bucket, every bucket run once before listening).
#
#   benchmarks/serve/shapes.sh BIN_DIR OUT_DIR [REQUESTS]
#
# BIN_DIR holds server, kvtier and run.sh as for run.sh; REQUESTS (default
# 12) bounds the requests sent. CUDA_MODULE_LOADING passes through (unset:
# lazy, the driver's default).
set -uo pipefail
if [[ $# -lt 2 ]]; then
	echo "usage: $0 BIN_DIR OUT_DIR [REQUESTS]" >&2
	exit 2
fi
bin=$1 out=$2 n=${3:-12}
trace=$(dirname "$0")/shapes-trace.jsonl
for variant in exact buckets; do
	flags="-model llama-3.1-8b -gpu-kv 2GiB -host 1GiB -context 16400"
	[[ $variant == exact ]] && flags+=" -exact-rows"
	SERVER_FLAGS="$flags" BENCH_FLAGS="--vocab 128256 --max-tokens 1 --per-request --requests $n" \
		"$bin/run.sh" "$bin" "$trace" "$out/$variant" gpu-only >"$out/$variant.log" 2>&1
	echo "$variant: $(grep -o 'up after [0-9]* s' "$out/$variant.log")"
done
