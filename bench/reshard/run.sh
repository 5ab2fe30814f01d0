#!/usr/bin/env bash
# Keys changing home under load, measured (README, "Changing the topology online"):
# a two-region cluster (3 nodes per region, 2 shards per region) on 127.0.0.1
# is filled with RECORDS retained records, then, while idembench runs at
# CLIENTS clients, grows to 4 shards per region and then gains a third
# region. Prints, per change: how long it took, the records and bytes moved
# (and per second), the pause of one batch of partitions (p50, p99, max,
# from the nodes' logs), and the load's cycles/s, p99 and failed calls before
# and during the change (idembench --target json does not retry: every 503
# counts as failed).
#
#   bench/reshard/run.sh                      # RECORDS=1000000 CLIENTS=64
#   RECORDS=100000 bench/reshard/run.sh       # quicker
#
# Every process it starts is stopped when it ends (or on Ctrl-C).
set -euo pipefail
cd "$(dirname "$0")/../.."
RECORDS=${RECORDS:-1000000}
CLIENTS=${CLIENTS:-64}
FILL_CLIENTS=${FILL_CLIENTS:-128}
BASE=${BASE_PORT:-27000}
dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-reshard.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	echo "logs and data: $dir"
}
trap cleanup EXIT

echo "building into $dir/bin"
CGO_ENABLED=0 go build -o "$dir/bin/" ./cmd/idemnode ./cmd/idemctl ./cmd/idembench

# node REGION I -> "  - id: REGION-I" with ports from BASE
node() {
	local n=$(( $2 + 10 * $3 ))
	cat <<EOF
      - id: $1-$2
        raft_addr: 127.0.0.1:$((BASE + n))
        grpc_addr: 127.0.0.1:$((BASE + 100 + n))
        http_addr: 127.0.0.1:$((BASE + 200 + n))
EOF
}
# topology VERSION SHARDS REGIONS...
topology() {
	local v=$1 shards=$2
	shift 2
	echo "cluster: reshard"
	echo "version: $v"
	echo "shards_per_region: $shards"
	echo "replicas: 3"
	echo "survival: zone"
	echo "regions:"
	local r=0
	for region in "$@"; do
		echo "  - name: $region"
		echo "    nodes:"
		for i in 1 2 3; do node "$region" "$i" "$r"; done
		r=$((r + 1))
	done
}
topology 1 2 us-east eu-west >"$dir/v1.yaml"
topology 2 4 us-east eu-west >"$dir/v2.yaml"
topology 3 4 us-east eu-west ap-south >"$dir/v3.yaml"

start_node() { # ID FILE
	"$dir/bin/idemnode" --config "$2" --id "$1" --data-dir "$dir/data/$1" >"$dir/$1.log" 2>&1 &
	pids+=($!)
}
for r in us-east eu-west; do for i in 1 2 3; do start_node "$r-$i" "$dir/v1.yaml"; done; done
for i in $(seq 1 120); do
	ready=0
	for r in 0 1; do for i2 in 1 2 3; do
		curl -sf "http://127.0.0.1:$((BASE + 200 + i2 + 10 * r))/readyz" >/dev/null && ready=$((ready + 1))
	done; done
	[ "$ready" = 6 ] && break
	sleep 1
done
[ "$ready" = 6 ] || { echo "the cluster did not become ready"; exit 1; }
json_addrs="127.0.0.1:$((BASE + 201)),127.0.0.1:$((BASE + 202)),127.0.0.1:$((BASE + 211)),127.0.0.1:$((BASE + 212))"
grpc_addrs="127.0.0.1:$((BASE + 101)),127.0.0.1:$((BASE + 102)),127.0.0.1:$((BASE + 103)),127.0.0.1:$((BASE + 111)),127.0.0.1:$((BASE + 112)),127.0.0.1:$((BASE + 113))"
ctl() { "$dir/bin/idemctl" --config "$dir/v1.yaml" --timeout 20s "$@"; }

echo "filling $RECORDS records ($FILL_CLIENTS clients, gRPC)"
"$dir/bin/idembench" --target grpc --addr "$grpc_addrs" --concurrency "$FILL_CLIENTS" --cycles "$RECORDS" --max-attempts 5 \
	--namespace filled --json >"$dir/fill.json"
echo "fill: $(python3 -c "import json; d = json.load(open('$dir/fill.json')); print(f\"{d['cycles_ok']} records at {d['cycles_per_s']:.0f}/s, {d['cycles_failed']} failed\")")"

bench() { # NAME DURATION: idembench at CLIENTS clients through the JSON API
	"$dir/bin/idembench" --target json --addr "$json_addrs" --concurrency "$CLIENTS" --duration "$2" --json >"$dir/$1.json" 2>"$dir/$1.err"
}
summary() { # NAME
	python3 - "$dir/$1.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
ok, failed = d["cycles_ok"], d["cycles_failed"]
print(f"{d['cycles_per_s']:.0f} cycles/s, cycle p50 {d['cycle']['p50_ms']:.1f} ms, p99 {d['cycle']['p99_ms']:.1f} ms, max {d['cycle']['max_ms']:.0f} ms; "
      f"{failed} of {ok + failed} cycles failed ({100 * ok / max(ok + failed, 1):.3f}% ok; errors {d.get('errors') or {}})")
EOF
}
moved() { # LOGS_SINCE_MARKER: sum the batches the nodes logged after the marker line count
	python3 - "$dir" "$1" <<'EOF'
import glob, re, sys
d, since = sys.argv[1], float(sys.argv[2])
rec = byt = 0; pauses = []
unit = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1000.0}
for f in glob.glob(d + "/*.log"):
    for line in open(f, errors="replace"):
        m = re.search(r'time=(\S+) .*partitions moved.* records=(\d+) bytes=(\d+) paused=([0-9.]+)(ns|µs|us|ms|s)\b', line)
        if not m: continue
        import datetime
        t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        if t < since: continue
        rec += int(m.group(2)); byt += int(m.group(3)); pauses.append(float(m.group(4)) * unit[m.group(5)])
pauses.sort()
if not pauses: print("no batch logged"); sys.exit()
q = lambda f: pauses[min(len(pauses) - 1, int(f * len(pauses)))]
print(f"{len(pauses)} batches, {rec} records, {byt / 1e6:.1f} MB moved; pause per batch p50 {q(.5):.0f} ms, p99 {q(.99):.0f} ms, max {pauses[-1]:.0f} ms", end="")
EOF
}

bench before 20s
echo "before: $(summary before)"

change() { # NAME FILE
	local t0 t1
	"$dir/bin/idembench" --target json --addr "$json_addrs" --concurrency "$CLIENTS" --duration 600s --json >"$dir/$1.json" 2>"$dir/$1.err" &
	local bpid=$!
	pids+=("$bpid")
	sleep 5
	t0=$(date +%s.%N)
	if ! ctl topology apply "$2" >"$dir/$1.apply" 2>&1; then
		echo "$1: apply failed:"; tail -5 "$dir/$1.apply"; exit 1
	fi
	t1=$(date +%s.%N)
	sleep 5
	kill -INT "$bpid"
	wait "$bpid" || true
	local took
	took=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
	echo "$1: took ${took} s; $(moved "$t0") ($(python3 -c "
import re
s = open('$dir/$1.apply').read()
print('apply ok' if 'active' in s else 'apply output: ' + s[-200:])"))"
	echo "  load during (apply + 10 s): $(summary "$1")"
}
change grow-shards "$dir/v2.yaml"
for i in 1 2 3; do start_node "ap-south-$i" "$dir/v3.yaml"; done
change add-region "$dir/v3.yaml"
bench after 20s
echo "after: $(summary after)"
echo "machine: $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
