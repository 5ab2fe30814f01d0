#!/usr/bin/env bash
# Runs three regions of three idemnodes plus one idemrouter per region on
# this machine (loopback only), from deploy/examples/three-region.yaml, until
# Ctrl-C. Logs, data and certificates go to ./idem-demo/. It runs in secure
# mode: a CA and one certs dir per process in ./idem-demo/certs (made once
# with idemctl cert), TLS and mTLS everywhere, and an auth file whose only
# principal is root (the client certificate in ./idem-demo/certs/client).
# INSECURE=1 runs it in plaintext instead; IDEM_DEMO_DIR=DIR puts it all in
# DIR instead of ./idem-demo. If a process exits or a port does not answer
# as ready within 30 s (a port taken by something else, say), it says which,
# shows the end of that process's log, stops the others and exits 1. Usage:
#   deploy/examples/three-regions.sh            # survival: region (as in the file)
#   SURVIVAL=zone deploy/examples/three-regions.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${IDEM_DEMO_DIR:-./idem-demo}
mkdir -p "$out/bin"
topo=deploy/examples/three-region.yaml
if [ "${SURVIVAL:-}" = zone ]; then
  sed 's/^survival: region/survival: zone/' "$topo" > "$out/topology.yaml"
else
  cp "$topo" "$out/topology.yaml"
fi
go build -o "$out/bin/" ./cmd/idemnode ./cmd/idemrouter ./cmd/idemctl

nodes="us-east-1 us-east-2 us-east-3 eu-west-1 eu-west-2 eu-west-3 ap-south-1 ap-south-2 ap-south-3"
routers="router-us-east router-eu-west router-ap-south"
ctl=("$out/bin/idemctl" --config "$out/topology.yaml")
curl=(curl -sf)
scheme=http
secure() { :; } # secure ID: the flags of process ID
if [ "${INSECURE:-0}" != 1 ]; then
  certs=$out/certs
  [ -f "$certs/ca/ca.crt" ] || "$out/bin/idemctl" cert create-ca --certs-dir "$certs/ca" >/dev/null
  for id in $nodes $routers; do
    mkdir -p "$certs/$id"
    [ -f "$certs/$id/ca.crt" ] || cp "$certs/ca/ca.crt" "$certs/$id/"
    [ -f "$certs/$id/node.crt" ] || "$out/bin/idemctl" cert create-node --certs-dir "$certs/$id" \
      --ca-key "$certs/ca/ca.key" --id "$id" 127.0.0.1 localhost >/dev/null
  done
  mkdir -p "$certs/client"
  [ -f "$certs/client/ca.crt" ] || cp "$certs/ca/ca.crt" "$certs/client/"
  [ -f "$certs/client/client.root.crt" ] || "$out/bin/idemctl" cert create-client --certs-dir "$certs/client" \
    --ca-key "$certs/ca/ca.key" root >/dev/null
  printf 'principals:\n  - {name: root, namespaces: ["*"], role: admin}\n' >"$out/auth.yaml"
  secure() { echo --certs-dir "$certs/$1" --auth-file "$out/auth.yaml"; }
  ctl+=(--certs-dir "$certs/client")
  curl+=(--cacert "$certs/client/ca.crt" --cert "$certs/client/client.root.crt" --key "$certs/client/client.root.key")
  scheme=https
fi

pids=()
names=() # names[i] is the process of pids[i]; its log is $out/NAME.log
cleanup() {
  echo "stopping..."
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

for id in $nodes; do
  # shellcheck disable=SC2046 # secure's words are flags
  "$out/bin/idemnode" --config "$out/topology.yaml" --id "$id" --data-dir "$out/data/$id" $(secure "$id") >"$out/$id.log" 2>&1 &
  pids+=($!)
  names+=("$id")
done
port=0
for region in us-east eu-west ap-south; do
  "$out/bin/idemrouter" --config "$out/topology.yaml" --region "$region" \
    --http-addr "127.0.0.1:809$port" --grpc-addr "127.0.0.1:709$port" $(secure "router-$region") >"$out/router-$region.log" 2>&1 &
  pids+=($!)
  names+=("router-$region")
  port=$((port + 1))
done
# exited: true (after saying which, with its log's end) once a process has exited.
exited() {
  local i
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      echo "three-regions: ${names[$i]} exited; the end of $out/${names[$i]}.log:" >&2
      tail -n 5 "$out/${names[$i]}.log" >&2
      return 0
    fi
  done
  return 1
}
for p in 8101 8102 8103 8104 8105 8106 8107 8108 8109 8090 8091 8092; do
  ready=0
  for _ in $(seq 1 300); do
    if exited; then exit 1; fi
    if "${curl[@]}" --max-time 2 "$scheme://127.0.0.1:$p/readyz" >/dev/null 2>&1; then
      ready=1
      break
    fi
    sleep 0.1
  done
  if [ "$ready" != 1 ]; then
    echo "three-regions: nothing answers ready on 127.0.0.1:$p after 30 s (is the port taken?); logs in $out/" >&2
    exit 1
  fi
done
if exited; then exit 1; fi
"${ctl[@]}" status || true
cat <<MSG

Three regions are up. Routers: us-east 127.0.0.1:8090, eu-west 127.0.0.1:8091, ap-south 127.0.0.1:8092
(JSON API; gRPC on 7090-7092). Nodes: 127.0.0.1:8101-8109. Logs in $out/. Ctrl-C stops everything.
Try: ${curl[*]} -X POST $scheme://127.0.0.1:8090/v1/namespaces/demo/keys/k1:reserve -d '{}'
     ${ctl[*]} status
MSG
wait
