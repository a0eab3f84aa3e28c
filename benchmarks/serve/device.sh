#!/usr/bin/env bash
# One device session of the serve benchmark: records the machine, runs
# run.sh (every strategy against the same trace, one after the other) and
# packs what it wrote into OUT/run.tar.gz, with the machine's description
# and run.sh's log beside it (the device tool brings back few files).
#
#   benchmarks/serve/device.sh DIR OUT [STRATEGY...]
#
# DIR holds server, kvtier (built with cgo for the GPU: go build -o DIR/
# ./examples/server ./cmd/kvtier), run.sh and trace.jsonl. SERVER_FLAGS,
# BENCH_FLAGS, VERIFY, PORT and FLAGS_<label> pass through to run.sh.
# NVME_DIR (default /var/tmp/kvtier-serve) is the parent of each run's NVMe
# directory: a disk that takes direct I/O, not the tmpfs /tmp may be.
set -uo pipefail
if [[ $# -lt 2 ]]; then
	echo "usage: $0 DIR OUT [STRATEGY...]" >&2
	exit 2
fi
dir=$1 out=$2
shift 2
mkdir -p "$out/run" "${NVME_DIR:-/var/tmp/kvtier-serve}"
{
	date -u +%FT%TZ
	uname -a
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
	nproc
	free -g | sed -n 2p
	df -h "${NVME_DIR:-/var/tmp}" | tail -1
	findmnt -no FSTYPE,SOURCE -T "${NVME_DIR:-/var/tmp}"
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"
nvme=${NVME_DIR:-/var/tmp/kvtier-serve}
mkdir -p "$nvme"
rm -rf "${nvme:?}"/*
export SERVER_FLAGS="${SERVER_FLAGS:--model llama-3.1-8b -gpu-kv 2GiB -host 6GiB -nvme 32GiB -context 16400 -max-queue 4096 -max-batch 16}"
export NVME_PARENT=$nvme # a directory per run, removed after it
"$dir/run.sh" "$dir" "$dir/trace.jsonl" "$out/run" "$@" 2>&1 | tee "$out/run.log"
rc=${PIPESTATUS[0]}
tar -C "$out" -czf "$out/run.tar.gz" run && rm -rf "$out/run"
rm -rf "${nvme:?}"
exit "$rc"
