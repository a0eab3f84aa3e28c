#!/usr/bin/env bash
# The replay's fidelity, served side: for each trace named, the model server
# in every tier configuration below (benchmarks/serve/run.sh, one server at
# a time), then OUT/fidelity.tar.gz with what benchmarks/serve/fidelity
# reads to set the replay's prediction beside each measurement.
#
#   benchmarks/serve/fidelity.sh DIR OUT TRACE...
#
# DIR holds server and kvtier (built for the GPU), run.sh,
# calibration.json (the server's starting calibration) and
# traces/TRACE.jsonl. The cells: the cost server with 32 GiB of host tier
# and no NVMe; the cost server with 4 GiB of host tier over 40 GiB of NVMe
# on NVME_DIR's disk (default /var/tmp), probed first with
# kvtier probe --nvme (OUT/drive.json); gpu-only, which uses no lower tier
# (it is also the cost server's GPU-only configuration). CELLS picks the
# cells (default "cost-host32 cost-host4 gpu-only"); cost-host32-fp8 and
# cost-host4-fp8 are those two with the lower tiers holding CODEC's blocks
# (default fp8-e4m3, -host-codec; NVMe follows it). HOST_BIG, HOST_SMALL
# and NVME_BYTES change the tiers' sizes (a dry run on a small machine),
# SERVER_FLAGS the rest of the server's flags.
set -uo pipefail
if [[ $# -lt 3 ]]; then
	echo "usage: $0 DIR OUT TRACE..." >&2
	exit 2
fi
dir=$1 out=$2
shift 2
# The NVMe directories live in a directory of this run's own under
# NVME_DIR, removed at the end (never NVME_DIR itself).
mkdir -p "$out/fidelity" "${NVME_DIR:-/var/tmp}"
nvme=$(mktemp -d "${NVME_DIR:-/var/tmp}/kvtier-fidelity.XXXXXX") || exit 1
mkdir -p "$nvme/probe"
export SERVER_FLAGS="${SERVER_FLAGS:--model llama-3.1-8b -gpu-kv 2GiB -context 16400 -max-queue 4096 -max-batch 16 -cost-calibration $dir/calibration.json}"
export BENCH_FLAGS="${BENCH_FLAGS:---vocab 128256 --max-tokens 2 --per-request}"
export VERIFY=0 NVME_PARENT=$nvme
big=${HOST_BIG:-32GiB} small=${HOST_SMALL:-4GiB} nvme_bytes=${NVME_BYTES:-40GiB}
codec=${CODEC:-fp8-e4m3}
# The bf16 cells say -host-codec none: the server's default, auto, would
# choose FP8 for them.
export FLAGS_cost_host32="-host $big -nvme 0 -host-codec none" FLAGS_cost_host4="-host $small -nvme $nvme_bytes -host-codec none" FLAGS_gpu_only="-host $big -nvme 0 -host-codec none"
export FLAGS_cost_host32_fp8="$FLAGS_cost_host32 -host-codec $codec" FLAGS_cost_host4_fp8="$FLAGS_cost_host4 -host-codec $codec"
# cells.tsv's line of each cell (label, strategy, host, NVMe, codec) and
# run.sh's argument.
declare -A line=(
	[cost-host32]="cost-host32	cost	$big	0"
	[cost-host4]="cost-host4	cost	$small	$nvme_bytes"
	[gpu-only]="gpu-only	gpu-only	$big	0"
	[cost-host32-fp8]="cost-host32-fp8	cost	$big	0	$codec"
	[cost-host4-fp8]="cost-host4-fp8	cost	$small	$nvme_bytes	$codec"
)
read -r -a cells <<<"${CELLS:-cost-host32 cost-host4 gpu-only}"
args=()
for c in "${cells[@]}"; do
	if [[ -z ${line[$c]:-} ]]; then
		echo "CELLS: no cell $c (cells: ${!line[*]})" >&2
		rm -rf "${nvme:?}"
		exit 2
	fi
	s=${line[$c]#*	}
	args+=("$c=${s%%	*}")
done
{
	date -u +%FT%TZ
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	nproc
	findmnt -no FSTYPE,SOURCE -T "$nvme"
} >"$out/fidelity/machine.txt" 2>&1
"$dir/kvtier" probe --nvme "$nvme/probe" --json "$out/fidelity/drive.json" >"$out/fidelity/probe.txt" 2>&1 || echo "the drive probe failed: see probe.txt"
rm -rf "${nvme:?}/probe"
status=0
for name in "$@"; do
	t=$out/fidelity/$name
	mkdir -p "$t"
	cp "$dir/traces/$name.jsonl" "$t/trace.jsonl"
	for c in "${cells[@]}"; do printf '%s\n' "${line[$c]}"; done >"$t/cells.tsv"
	"$dir/run.sh" "$dir" "$t/trace.jsonl" "$t/run" "${args[@]}" 2>&1 | tee "$t/run.log" || status=1
done
rm -rf "${nvme:?}"
tar -C "$out" -czf "$out/fidelity.tar.gz" fidelity && rm -rf "$out/fidelity"
exit "$status"
