#!/usr/bin/env bash
# Runs three regions of three idemnodes plus one idemrouter per region on
# this machine (loopback only), from deploy/examples/three-region.yaml, until
# Ctrl-C. Logs and data go to ./idem-demo/. Usage:
#   deploy/examples/three-regions.sh            # survival: region (as in the file)
#   SURVIVAL=zone deploy/examples/three-regions.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=./idem-demo
mkdir -p "$out/bin"
topo=deploy/examples/three-region.yaml
if [ "${SURVIVAL:-}" = zone ]; then
  sed 's/^survival: region/survival: zone/' "$topo" > "$out/topology.yaml"
else
  cp "$topo" "$out/topology.yaml"
fi
go build -o "$out/bin/" ./cmd/idemnode ./cmd/idemrouter ./cmd/idemctl

pids=()
cleanup() {
  echo "stopping..."
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

for id in us-east-1 us-east-2 us-east-3 eu-west-1 eu-west-2 eu-west-3 ap-south-1 ap-south-2 ap-south-3; do
  "$out/bin/idemnode" --config "$out/topology.yaml" --id "$id" --data-dir "$out/data/$id" >"$out/$id.log" 2>&1 &
  pids+=($!)
done
port=0
for region in us-east eu-west ap-south; do
  "$out/bin/idemrouter" --config "$out/topology.yaml" --region "$region" \
    --http-addr "127.0.0.1:809$port" --grpc-addr "127.0.0.1:709$port" >"$out/router-$region.log" 2>&1 &
  pids+=($!)
  port=$((port + 1))
done
for p in 8101 8102 8103 8104 8105 8106 8107 8108 8109 8090 8091 8092; do
  for _ in $(seq 1 300); do
    curl -sf "127.0.0.1:$p/readyz" >/dev/null && break
    sleep 0.1
  done
done
"$out/bin/idemctl" --config "$out/topology.yaml" status || true
cat <<MSG

Three regions are up. Routers: us-east 127.0.0.1:8090, eu-west 127.0.0.1:8091, ap-south 127.0.0.1:8092
(JSON API; gRPC on 7090-7092). Nodes: 127.0.0.1:8101-8109. Logs in $out/. Ctrl-C stops everything.
MSG
wait
