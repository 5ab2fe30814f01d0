#!/usr/bin/env bash
# Smoke test of deploy/compose/docker-compose.yml on this Docker host: builds
# the idem:dev image, starts the three nodes and the router, waits for
# /readyz, runs reserve / complete / replay through the router, kills the node
# that leads the key's shard and shows that writes and replays still work,
# restarts it and reads the key from it, stops everything (each process must
# drain and exit 0) and removes the containers, network and volumes.
#
#   deploy/compose/smoke.sh
#
# It runs as its own compose project (IDEM_SMOKE_PROJECT, default idemsmoke),
# so it never touches a deployment started from the same file. Everything it
# publishes is on 127.0.0.1; the host ports default to the compose file's and
# take the same variables (IDEM_NODE1_HTTP_PORT ... IDEM_ROUTER_GRPC_PORT).
# IDEM_SMOKE_SKIP_BUILD=1 uses the existing image; IDEM_SMOKE_TIMEOUT (seconds,
# default 300) bounds the whole run. Needs docker and docker compose (v2) or
# docker-compose (v1), curl; nothing is pulled. The cluster runs in secure
# mode: make-certs.sh makes its certificates in a temporary dir, every curl
# uses --cacert and the root client certificate.
set -euo pipefail
cd "$(dirname "$0")"
compose_dir=$(pwd)

project=${IDEM_SMOKE_PROJECT:-idemsmoke}
timeout_s=${IDEM_SMOKE_TIMEOUT:-300}
export IDEM_NODE1_HTTP_PORT=${IDEM_NODE1_HTTP_PORT:-8101}
export IDEM_NODE2_HTTP_PORT=${IDEM_NODE2_HTTP_PORT:-8102}
export IDEM_NODE3_HTTP_PORT=${IDEM_NODE3_HTTP_PORT:-8103}
export IDEM_ROUTER_HTTP_PORT=${IDEM_ROUTER_HTTP_PORT:-8090}
router="https://127.0.0.1:$IDEM_ROUTER_HTTP_PORT"
# Secure mode: certificates made by make-certs.sh into a directory of this
# run (removed by cleanup), never the user's deploy/compose/certs.
certs=$(mktemp -d "${TMPDIR:-/tmp}/idem-smoke-certs.XXXXXX")
export IDEM_CERTS_DIR="$certs"
tls=(--cacert "$certs/client/ca.crt" --cert "$certs/client/client.root.crt" --key "$certs/client/client.root.key")
ctl=(idemctl --certs-dir /client --config /etc/idem/topology.yaml)

if docker compose version >/dev/null 2>&1; then
  compose() { docker compose -p "$project" -f "$compose_dir/docker-compose.yml" "$@"; }
elif command -v docker-compose >/dev/null 2>&1; then
  compose() { docker-compose -p "$project" -f "$compose_dir/docker-compose.yml" "$@"; }
else
  echo "smoke: FAIL: neither 'docker compose' nor 'docker-compose' is installed" >&2
  exit 1
fi

step() { printf '\n== %s\n' "$*"; }
fail() {
  echo "smoke: FAIL: $*" >&2
  exit 1
}

started=0
watchdog=
cleanup() {
  status=$?
  trap - EXIT INT TERM
  set +e
  [ -n "$watchdog" ] && kill "$watchdog" 2>/dev/null
  if [ "$started" = 1 ]; then
    if [ "$status" != 0 ]; then
      echo "--- last log lines of each container (status $status)" >&2
      compose logs --tail 15 --no-color >&2 2>&1 || true
    fi
    step "cleanup: down -v (containers, network, volumes of project $project)"
    compose down -v --remove-orphans -t 20 >/dev/null 2>&1 || compose down -v >/dev/null 2>&1 || true
  fi
  rm -rf "$certs"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'echo "smoke: FAIL: interrupted or over ${timeout_s}s" >&2; exit 124' TERM
# The watchdog holds none of the script's output (a caller reading it to the
# end would wait for the sleep) and takes its sleep along when cancelled.
(
  trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
  sleep "$timeout_s" &
  sleeper=$!
  wait "$sleeper"
  kill -TERM $$ 2>/dev/null
) </dev/null >/dev/null 2>&1 &
watchdog=$!

# json_field NAME: the string (or number) value of the first "NAME" in stdin.
json_field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p" | head -n 1; }

# post URL BODY: prints the HTTP status and the body on one line each.
post() { curl "${tls[@]}" -s -m 10 -w '\n%{http_code}' -X POST "$1" -d "$2"; }

# wait_ready NAME ADDR SECONDS: polls GET ADDR/readyz until 200.
wait_ready() {
  local name=$1 addr=$2 deadline=$((SECONDS + $3)) last=
  while [ "$SECONDS" -lt "$deadline" ]; do
    if last=$(curl "${tls[@]}" -s -m 2 -w ' %{http_code}' "$addr/readyz" 2>&1) && [ "${last##* }" = 200 ]; then
      echo "$name ready ($addr)"
      return 0
    fi
    sleep 0.2
  done
  fail "$name at $addr not ready within $3 s; last answer: ${last:-none}"
}

# until_ok SECONDS URL BODY: repeats a POST until it answers 200 (a node was
# just lost: the shard elects a new leader, meanwhile 503 with Retry-After).
# Prints the body; the request must be safe to repeat (same owner token).
until_ok() {
  local deadline=$((SECONDS + $1)) out code tries=0
  while [ "$SECONDS" -lt "$deadline" ]; do
    tries=$((tries + 1))
    out=$(post "$2" "$3") || true
    code=${out##*$'\n'}
    if [ "$code" = 200 ]; then
      [ "$tries" -gt 1 ] && echo "  (answered 200 after $tries attempts)" >&2
      printf '%s\n' "${out%$'\n'*}"
      return 0
    fi
    sleep 0.2
  done
  fail "POST $2 did not answer 200 within $1 s; last: $code ${out%$'\n'*}"
}

if [ "${IDEM_SMOKE_SKIP_BUILD:-0}" != 1 ]; then
  step "build the idem:dev image"
  ../docker/build.sh
fi

step "certificates (make-certs.sh into $certs)"
"$compose_dir/make-certs.sh" "$certs"

step "up: three nodes and a router (project $project)"
started=1
compose down -v --remove-orphans >/dev/null 2>&1 || true
compose up -d
for svc in idem-1:8080 idem-2:8080 idem-3:8080 router:8090; do
  published=$(compose port "${svc%%:*}" "${svc##*:}")
  case "$published" in
  127.0.0.1:*) echo "${svc%%:*} publishes $svc on $published only" ;;
  *) fail "${svc%%:*} publishes ${svc##*:} on '$published', not on 127.0.0.1" ;;
  esac
done

step "wait for /readyz"
wait_ready idem-1 "https://127.0.0.1:$IDEM_NODE1_HTTP_PORT" 90
wait_ready idem-2 "https://127.0.0.1:$IDEM_NODE2_HTTP_PORT" 90
wait_ready idem-3 "https://127.0.0.1:$IDEM_NODE3_HTTP_PORT" 90
wait_ready router "$router" 60

step "secure mode: plaintext and certificate-less requests are refused"
if curl -s -m 5 "http://127.0.0.1:$IDEM_ROUTER_HTTP_PORT/readyz" -o /dev/null -w '%{http_code}' | grep -q '^2'; then
  fail "the router answered plaintext HTTP"
fi
code=$(curl --cacert "$certs/client/ca.crt" -s -m 5 -o /dev/null -w '%{http_code}' -X POST "$router/v1/namespaces/smoke/keys/x:reserve" -d '{}')
[ "$code" = 401 ] || fail "a reserve without a client certificate: want 401, got $code"
echo "plaintext refused; no client certificate: 401"

ns=smoke
key="order-$(date +%s)-$$"
owner="smoke-owner-$$-0000000000"
keys="$router/v1/namespaces/$ns/keys"
body=eyJjaGFyZ2UiOiJjaF8xIn0= # {"charge":"ch_1"}

step "reserve / complete / replay $ns/$key through the router"
out=$(until_ok 30 "$keys/$key:reserve" "{\"fingerprint\":\"fp-1\",\"owner_token\":\"$owner\"}")
echo "reserve:  $out"
[ "$(json_field outcome <<<"$out")" = ACQUIRED ] || fail "first reserve: want ACQUIRED, got $out"
fencing=$(json_field fencing_token <<<"$out")
out=$(until_ok 10 "$keys/$key:reserve" '{"fingerprint":"fp-1"}')
echo "retry:    $out"
[ "$(json_field outcome <<<"$out")" = IN_PROGRESS ] || fail "a retry while in progress: want IN_PROGRESS, got $out"
out=$(until_ok 10 "$keys/$key:complete" "{\"owner_token\":\"$owner\",\"response\":{\"status\":201,\"headers\":{\"Content-Type\":\"application/json\"},\"body\":\"$body\"}}")
echo "complete: $out"
out=$(until_ok 10 "$keys/$key:reserve" '{"fingerprint":"fp-1"}')
echo "replay:   $out"
[ "$(json_field outcome <<<"$out")" = COMPLETED ] || fail "reserve after complete: want COMPLETED, got $out"
[ "$(json_field body <<<"$out")" = "$body" ] || fail "replay: want body $body, got $out"
[ "$(json_field fencing_token <<<"$out")" = "$fencing" ] || fail "replay: want fencing token $fencing, got $out"

step "find the leader of the key's shard (idemctl inside the router's container)"
compose exec -T router "${ctl[@]}" locate "$ns" "$key"
located=$(compose exec -T router "${ctl[@]}" --json locate "$ns" "$key")
leader=$(json_field leader <<<"$(tr -d ' \n' <<<"$located")")
shard=$(json_field shard <<<"$(tr -d ' \n' <<<"$located")")
case "$leader" in
idem-1 | idem-2 | idem-3) ;;
*) fail "idemctl locate gave no leader: $located" ;;
esac
# A fresh key of the same shard, to write once its leader is gone.
same=
for i in $(seq 1 40); do
  k="$key-$shard-$i"
  l=$(compose exec -T router "${ctl[@]}" --json locate "$ns" "$k" | tr -d ' \n')
  if [ "$(json_field shard <<<"$l")" = "$shard" ]; then
    same=$k
    break
  fi
done
[ -n "$same" ] || fail "no key of shard $shard among 40 candidates"
echo "$ns/$same is also on shard $shard"

step "kill $leader (SIGKILL): the shard loses its leader"
compose kill "$leader"
state=$(docker inspect -f '{{.State.Status}}' "$(compose ps -a -q "$leader")")
[ "$state" = exited ] || fail "$leader is $state after kill, want exited"
echo "$leader is $state"

step "writes and replays go on with two of three nodes"
out=$(until_ok 30 "$keys/$key:reserve" '{"fingerprint":"fp-1"}')
echo "replay:   $out"
[ "$(json_field outcome <<<"$out")" = COMPLETED ] || fail "replay after losing $leader: want COMPLETED, got $out"
[ "$(json_field body <<<"$out")" = "$body" ] || fail "replay after losing $leader: want body $body, got $out"
for i in 1 2 3 4 5 6 7 8; do
  k="$key-after-$i"
  o="smoke-owner-$$-after-$i-000"
  r=$(until_ok 30 "$keys/$k:reserve" "{\"owner_token\":\"$o\"}")
  [ "$(json_field outcome <<<"$r")" = ACQUIRED ] || fail "reserve $k with $leader down: want ACQUIRED, got $r"
  until_ok 30 "$keys/$k:complete" "{\"owner_token\":\"$o\",\"response\":{\"status\":200,\"body\":\"$body\"}}" >/dev/null
done
echo "8 new keys reserved and completed with $leader down"
o="smoke-owner-$$-same-shard-000"
r=$(until_ok 30 "$keys/$same:reserve" "{\"owner_token\":\"$o\"}")
[ "$(json_field outcome <<<"$r")" = ACQUIRED ] || fail "reserve $same on shard $shard with $leader down: want ACQUIRED, got $r"
until_ok 30 "$keys/$same:complete" "{\"owner_token\":\"$o\",\"response\":{\"status\":200,\"body\":\"$body\"}}" >/dev/null
echo "$same (shard $shard, whose leader was killed) reserved and completed"
compose exec -T router "${ctl[@]}" --timeout 2s locate "$ns" "$same" || true
if state=$(docker inspect -f '{{.State.Status}}' "$(compose ps -a -q "$leader")") && [ "$state" != exited ]; then
  fail "$leader was restarted behind the test's back (state $state): the writes above did not run without it"
fi

step "restart $leader: it rejoins from its volume and serves the key"
compose start "$leader"
case "$leader" in
idem-1) port=$IDEM_NODE1_HTTP_PORT ;;
idem-2) port=$IDEM_NODE2_HTTP_PORT ;;
idem-3) port=$IDEM_NODE3_HTTP_PORT ;;
esac
wait_ready "$leader" "https://127.0.0.1:$port" 60
got=$(curl "${tls[@]}" -s -m 10 "https://127.0.0.1:$port/v1/namespaces/$ns/keys/$same")
echo "GET $same from $leader: $got"
[ "$(json_field state <<<"$got")" = COMPLETED ] || fail "GET $same from $leader: want COMPLETED, got $got"

step "stop: every process drains and exits 0"
compose stop -t 20
for svc in idem-1 idem-2 idem-3 router; do
  code=$(docker inspect -f '{{.State.ExitCode}}' "$(compose ps -a -q "$svc")")
  [ "$code" = 0 ] || fail "$svc exited $code after SIGTERM, want 0"
  echo "$svc exited 0"
done

step "the image's default command listens on the container's loopback only"
default_name="$project-default"
default_port=${IDEM_DEFAULT_HTTP_PORT:-8109}
docker rm -f "$default_name" >/dev/null 2>&1 || true
docker run -d --name "$default_name" -p "127.0.0.1:$default_port:8080" idem:dev >/dev/null
default_ok=
for _ in $(seq 100); do
  # idemctl exits 1 for a key with no record: that answer is the point.
  out=$(docker exec "$default_name" idemctl get --addr 127.0.0.1:7070 smoke absent 2>&1 || true)
  if grep -q "no record" <<<"$out"; then
    default_ok=1
    break
  fi
  sleep 0.2
done
if [ -z "$default_ok" ]; then
  docker logs --tail 20 "$default_name" >&2 || true
  docker rm -f "$default_name" >/dev/null 2>&1 || true
  fail "the default container does not answer on its own loopback"
fi
echo "default container answers inside, on 127.0.0.1:7070"
if curl -s -m 3 "http://127.0.0.1:$default_port/healthz" >/dev/null 2>&1; then
  docker rm -f "$default_name" >/dev/null 2>&1 || true
  fail "the default container answered on its published port: it listens beyond loopback without --insecure or certificates"
fi
echo "and nothing on its published port $default_port"
docker rm -f "$default_name" >/dev/null

echo
echo "smoke: PASS"
