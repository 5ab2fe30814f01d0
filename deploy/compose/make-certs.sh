#!/usr/bin/env bash
# Makes the certificates deploy/compose/docker-compose.yml runs with (secure
# mode), with idemctl cert, into deploy/compose/certs (or DIR):
#
#   deploy/compose/make-certs.sh [DIR]
#
#   DIR/ca/        ca.crt, ca.key        the cluster CA (keep ca.key off the nodes)
#   DIR/idem-N/    ca.crt, node.crt/.key node idem-N, valid for idem-N, localhost, 127.0.0.1
#   DIR/router/    ca.crt, node.crt/.key the router (routers get node certificates),
#                  proxy.key             the key of the proxy's Authorization hash
#   DIR/client/    ca.crt, client.root.crt/.key   the root principal (idemctl, curl)
#
# Existing files are never overwritten (idemctl refuses): delete DIR to start
# over. It uses idemctl from PATH, else builds it from this checkout (Go).
# The containers run as uid 65532: when run as root the node and router dirs
# are given to that uid; otherwise their keys are made readable by all (fine
# for a single-user dev host; use Kubernetes Secrets or your own tooling
# elsewhere).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/certs}
idemctl=${IDEMCTL:-$(command -v idemctl || true)}
if [ -z "$idemctl" ]; then
  idemctl="$(mktemp -d "${TMPDIR:-/tmp}/idemctl.XXXXXX")/idemctl"
  (cd "$here/../.." && CGO_ENABLED=0 go build -o "$idemctl" ./cmd/idemctl)
fi

mkdir -p "$dir"
if [ ! -f "$dir/ca/ca.crt" ]; then
  "$idemctl" cert create-ca --certs-dir "$dir/ca"
fi
cakey="$dir/ca/ca.key"
for id in idem-1 idem-2 idem-3 router; do
  mkdir -p "$dir/$id"
  [ -f "$dir/$id/ca.crt" ] || cp "$dir/ca/ca.crt" "$dir/$id/ca.crt"
  [ -f "$dir/$id/node.crt" ] || "$idemctl" cert create-node --certs-dir "$dir/$id" --ca-key "$cakey" --id "$id" "$id" localhost 127.0.0.1
done
[ -f "$dir/router/proxy.key" ] || head -c 32 /dev/urandom >"$dir/router/proxy.key"
mkdir -p "$dir/client"
[ -f "$dir/client/ca.crt" ] || cp "$dir/ca/ca.crt" "$dir/client/ca.crt"
[ -f "$dir/client/client.root.crt" ] || "$idemctl" cert create-client --certs-dir "$dir/client" --ca-key "$cakey" root

for id in idem-1 idem-2 idem-3 router client; do
  if [ "$(id -u)" = 0 ]; then
    chown -R 65532:65532 "$dir/$id"
  else
    chmod a+r "$dir/$id"/*
  fi
done
echo "certificates in $dir (CA key: $cakey)"
