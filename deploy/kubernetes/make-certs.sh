#!/usr/bin/env bash
# Makes the certificates of deploy/kubernetes (secure mode) with idemctl cert
# and puts them, with auth.yaml, into the Secret idem-certs of namespace idem:
#
#   deploy/kubernetes/make-certs.sh [DIR]      # DIR default: deploy/kubernetes/certs (keep it safe)
#
#   DIR/ca/                ca.crt, ca.key (the CA key stays here, never in the cluster)
#   DIR/idem-us-east-N/    node.crt/.key for pod idem-us-east-N (its stable DNS names)
#   DIR/router/            node.crt/.key for the routers (Service idem-router-us-east), proxy.key
#   DIR/client/            ca.crt, client.root.crt/.key (idemctl --certs-dir DIR/client)
#
# The Secret holds ca.crt, auth.yaml, proxy.key, router.crt/.key and
# idem-us-east-N.crt/.key; the manifests mount each pod's pair as
# /certs/node.crt and /certs/node.key. With kubectl on PATH the Secret's
# manifest is written to DIR/secret.yaml (nothing is sent to a cluster:
# kubectl apply -f it); otherwise the kubectl command is printed. Existing
# certificates are kept (idemctl never overwrites): delete DIR to start over.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/certs}
ns=idem
region=us-east
nodes=3
idemctl=${IDEMCTL:-$(command -v idemctl || true)}
if [ -z "$idemctl" ]; then
  idemctl="$(mktemp -d "${TMPDIR:-/tmp}/idemctl.XXXXXX")/idemctl"
  (cd "$here/../.." && CGO_ENABLED=0 go build -o "$idemctl" ./cmd/idemctl)
fi

mkdir -p "$dir"
[ -f "$dir/ca/ca.crt" ] || "$idemctl" cert create-ca --certs-dir "$dir/ca"
cakey="$dir/ca/ca.key"
issue() { # issue DIR ID HOST...
  local d=$1 id=$2
  shift 2
  mkdir -p "$d"
  [ -f "$d/ca.crt" ] || cp "$dir/ca/ca.crt" "$d/ca.crt"
  [ -f "$d/node.crt" ] || "$idemctl" cert create-node --certs-dir "$d" --ca-key "$cakey" --id "$id" "$@"
}
files=(--from-file=ca.crt="$dir/ca/ca.crt" --from-file=auth.yaml="$here/auth.yaml")
for i in $(seq 0 $((nodes - 1))); do
  pod=idem-$region-$i
  issue "$dir/$pod" "$pod" "$pod.idem-$region.$ns.svc.cluster.local" "$pod.idem-$region" localhost 127.0.0.1
  files+=(--from-file="$pod.crt=$dir/$pod/node.crt" --from-file="$pod.key=$dir/$pod/node.key")
done
issue "$dir/router" "router-$region" "idem-router-$region" "idem-router-$region.$ns" "idem-router-$region.$ns.svc" \
  "idem-router-$region.$ns.svc.cluster.local" localhost 127.0.0.1
[ -f "$dir/router/proxy.key" ] || head -c 32 /dev/urandom >"$dir/router/proxy.key"
files+=(--from-file=router.crt="$dir/router/node.crt" --from-file=router.key="$dir/router/node.key" --from-file=proxy.key="$dir/router/proxy.key")
mkdir -p "$dir/client"
[ -f "$dir/client/ca.crt" ] || cp "$dir/ca/ca.crt" "$dir/client/ca.crt"
[ -f "$dir/client/client.root.crt" ] || "$idemctl" cert create-client --certs-dir "$dir/client" --ca-key "$cakey" root

# The Secret's manifest, written without contacting any cluster.
if command -v kubectl >/dev/null 2>&1; then
  (umask 077 && kubectl create secret generic idem-certs -n "$ns" "${files[@]}" --dry-run=client -o yaml >"$dir/secret.yaml")
  echo "the Secret: kubectl apply -f $dir/secret.yaml   (then kubectl apply -k $here)"
else
  echo "kubectl not found; create the Secret with:"
  printf '  kubectl create secret generic idem-certs -n %s' "$ns"
  printf ' %q' "${files[@]}"
  echo
fi
echo "certificates in $dir; clients use $dir/client (idemctl --certs-dir $dir/client)"
