#!/usr/bin/env bash
# Serve benchmark: starts the model server (examples/server) once per
# strategy, replays one trace against it with kvtier bench-serve, and keeps
# bench-serve's JSON report, the server's log and its /metrics per
# strategy. The same trace, flags and machine for every strategy, in one
# run, so that the cost strategy is compared with its baselines measured
# minutes apart. benchmarks/serve/report turns the output into
# benchmarks/results/serve-<machine>.{json,md}.
#
#   benchmarks/serve/run.sh BIN_DIR TRACE OUT_DIR [STRATEGY...]
#
# BIN_DIR holds the server and kvtier binaries (go build -o BIN_DIR/server
# ./examples/server; go build -o BIN_DIR/kvtier ./cmd/kvtier). STRATEGY
# defaults to "cost gpu-only none"; LABEL=STRATEGY runs STRATEGY under
# another name (two runs of one strategy with other flags). SERVER_FLAGS
# and BENCH_FLAGS replace the defaults below, for every run; FLAGS_<label>
# (the label's dashes as underscores, e.g. FLAGS_cost_wrong) adds server
# flags to one run. Each run writes the server's calibration to
# OUT_DIR/calibration-LABEL.json (-cost-calibration-out) for a model of
# kvtier/cost. SERVER_<label> (the same spelling) runs another server
# binary for one run, today's code beside the new say. NVME_PARENT, when
# set, gives each run an NVMe directory of its own, NVME_PARENT/LABEL,
# removed after the run (so that no run adopts another's blocks, and the
# disk holds one run's tier at a time), unless the run's flags turn the
# tier off (-nvme 0). VERIFY
# (default 10) is bench-serve's --verify for the run labelled cost; PORT
# (default 8311) the loopback port.
set -uo pipefail
if [[ $# -lt 3 ]]; then
	echo "usage: $0 BIN_DIR TRACE OUT_DIR [STRATEGY...]" >&2
	exit 2
fi
bin=$1 trace=$2 out=$3
shift 3
strategies=("$@")
[[ ${#strategies[@]} -gt 0 ]] || strategies=(cost gpu-only none)
port=${PORT:-8311}
read -r -a server_flags <<<"${SERVER_FLAGS:--model llama-3.1-8b -gpu-kv 2GiB -host 32GiB -nvme 16GiB -context 16400 -max-queue 4096 -max-batch 16}"
read -r -a bench_flags <<<"${BENCH_FLAGS:---vocab 128256}"
mkdir -p "$out"

# get PATH prints the body of GET PATH on the server (bash's /dev/tcp: the
# GPU machine may have no curl).
get() {
	exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
	printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$1" >&3
	sed '1,/^\r$/d' <&3
	exec 3<&-
}

status=0
for arg in "${strategies[@]}"; do
	label=${arg%%=*} s=${arg#*=}
	extra_var=FLAGS_${label//-/_}
	read -r -a extra <<<"${!extra_var:-}"
	server_var=SERVER_${label//-/_}
	server=${!server_var:-$bin/server}
	calout=()
	[[ " ${server_flags[*]} " == *" -model tiny "* ]] || calout=(-cost-calibration-out "$out/calibration-$label.json")
	nvme=()
	if [[ -n ${NVME_PARENT:-} && " ${extra[*]} " != *" -nvme 0 "* ]]; then
		rm -rf "${NVME_PARENT:?}/$label"
		nvme=(-nvme-dir "$NVME_PARENT/$label")
	fi
	log=$out/server-$label.log
	echo "== $label: $server -addr 127.0.0.1:$port -strategy $s ${server_flags[*]} ${nvme[*]} ${extra[*]} ${calout[*]}"
	SECONDS=0
	"$server" -addr "127.0.0.1:$port" -strategy "$s" "${server_flags[@]}" "${nvme[@]}" "${extra[@]}" "${calout[@]}" >"$log" 2>&1 &
	pid=$!
	up=0
	for _ in $(seq 1 900); do
		if [[ $(get /healthz 2>/dev/null) == ok* ]]; then
			up=1
			break
		fi
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.2
	done
	if [[ $up != 1 ]]; then
		echo "server ($label) did not come up:"
		tail -20 "$log"
		kill -TERM "$pid" 2>/dev/null
		wait "$pid"
		status=1
		continue
	fi
	echo "server up after ${SECONDS} s"
	verify=()
	[[ $label == cost ]] && verify=(--verify "${VERIFY:-10}")
	"$bin/kvtier" bench-serve --url "http://127.0.0.1:$port" --trace "$trace" --json --progress never \
		"${verify[@]}" "${bench_flags[@]}" >"$out/bench-$label.json" 2>"$out/bench-$label.err"
	rc=$?
	echo "bench-serve ($label): exit $rc"
	tail -3 "$out/bench-$label.err"
	[[ $rc == 0 ]] || status=1
	get /metrics >"$out/metrics-$label.txt" 2>/dev/null
	kill -TERM "$pid"
	wait "$pid"
	echo "server ($label): exit $? after ${SECONDS} s"
	[[ -z ${NVME_PARENT:-} ]] || rm -rf "${NVME_PARENT:?}/$label"
	tail -2 "$log"
done
exit $status
