#!/usr/bin/env bash
# HTTP/3 to clients (DESIGN §9), side by side on one machine: shardgate
# against Caddy (Debian's 2.6 package, which serves HTTP/3) in front of the
# same backend nginx, each proxy pinned to core 0 with one thread (Caddy:
# GOMAXPROCS=1), the load client and the backend on core 1.
#
# - CPU per request over HTTP/3, GET and a 1 KiB POST, CONNS connections ×
#   STREAMS requests in flight (examples/h3load.rs: neither h2load nor wrk
#   speaks HTTP/3 here), and shardgate's own per request over HTTP/2 with
#   TLS (h2load, same shape) for the ratio;
# - memory per idle HTTP/3 connection (IDLE connections held open, the
#   proxy's RSS before and after);
# - one 1 GiB download over HTTP/3 and over HTTP/2 (curl) through
#   shardgate, MB/s and shardgate's CPU per GiB (the client runs beside
#   the backend on core 1: h3load, quinn in one thread, is the slower
#   client, so MB/s says less than the CPU does).
# Interleaved over ROUNDS rounds; prints medians (min-max).
#
#   bash benches/load/http3.sh [--build]
#
# Environment (defaults):
#   SHARDGATE_BIN=target/release/shardgate   (and h3load beside it, in
#                                             examples/)
#   BUILD=0      1 (or --build): build both first
#   ROUNDS=3     rounds
#   SECS=5       seconds per run
#   CONNS=32     connections
#   STREAMS=10   requests in flight per connection
#   IDLE=1000    idle connections for the memory figure
#   BIG=1        1: the 1 GiB downloads too
#   LOAD=1       0: only the downloads
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CALLER=$PWD
# shellcheck source=benches/load/lib.sh
source "$HERE/lib.sh"
parse_args "$0" "$@"
ROUNDS=${ROUNDS:-3} SECS=${SECS:-5} CONNS=${CONNS:-32} STREAMS=${STREAMS:-10}
IDLE=${IDLE:-1000} BIG=${BIG:-1} LOAD=${LOAD:-1}
if [[ ${BUILD:-0} == 1 ]]; then
  (cd "$ROOT" && cargo build --release --bin shardgate --example h3load)
  BUILD=0
fi
resolve_shardgate_bin "$ROOT" "$CALLER"
H3LOAD=${H3LOAD:-$(dirname "$SHARDGATE_BIN")/examples/h3load}
[[ -x $H3LOAD ]] || die "no h3load at $H3LOAD: cargo build --release --example h3load (or --build)"
command -v caddy >/dev/null || die "caddy is missing (apt-get install caddy)"
command -v nginx >/dev/null || die "nginx is missing (apt-get install nginx)"
command -v h2load >/dev/null || die "h2load is missing (apt-get install nghttp2-client)"
lib_init

BACKEND=18501 SG=18543 ADMIN=18581 CADDY=18544 CADDY_ADMIN=18582
check_ports_free $BACKEND $SG $ADMIN $CADDY
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=localhost -addext subjectAltName=DNS:localhost \
  -keyout "$SG_WORK/localhost.key" -out "$SG_WORK/localhost.crt" 2>/dev/null
mkdir -p "$SG_WORK/certs" "$SG_WORK/docs" "$SG_WORK/backend-tmp"
cp "$SG_WORK/localhost.crt" "$SG_WORK/certs/localhost.crt"
cp "$SG_WORK/localhost.key" "$SG_WORK/certs/localhost.key"
chmod 755 "$SG_WORK/docs"
if [[ $BIG == 1 ]]; then truncate -s 1G "$SG_WORK/docs/big"; fi
head -c 1024 /dev/zero | tr '\0' x >"$SG_WORK/post.body"
cat >"$SG_WORK/backend.conf" <<CONF
worker_processes 1;
daemon off;
pid $SG_WORK/backend.pid;
error_log $SG_WORK/backend-error.log warn;
events { worker_connections 4096; }
http {
$(nginx_paths "$SG_WORK" backend)
    access_log off;
    keepalive_requests 100000000;
    server {
        listen 127.0.0.1:$BACKEND;
        root $SG_WORK/docs;
        location = /big { }
        location / { return 200 "hello from the backend\n"; }
    }
}
CONF
spawn backend TERM taskset -c 1 nginx -p "$SG_WORK/" -c "$SG_WORK/backend.conf" -e "$SG_WORK/backend-error.log"
wait_tcp $BACKEND "$SPAWNED" backend

cat >"$SG_WORK/shardgate.yaml" <<CONF
server: { threads: 1, pid_file: $SG_WORK/shardgate.pid, upgrade_sock: $SG_WORK/shardgate.sock }
listen:
  - { addr: "127.0.0.1:$SG", tls: true }
  - { addr: "127.0.0.1:$SG", quic: true }
admin: { addr: "127.0.0.1:$ADMIN" }
tls: { certs: $SG_WORK/certs, default_cert: localhost }
quic: { max_streams: 100 }
state: false
shards: [{ id: s1, url: "http://127.0.0.1:$BACKEND" }]
limits: { connection_cap: 1000000, max_body_bytes: 2000000000 }
upstream: { read_timeout_ms: 120000 }
domains: { map: { localhost: t } }
log: { access: off }
CONF
cat >"$SG_WORK/Caddyfile" <<CONF
{
	admin 127.0.0.1:$CADDY_ADMIN
	auto_https off
	servers {
		protocols h1 h2 h3
	}
	log {
		level ERROR
	}
}
https://localhost:$CADDY {
	bind 127.0.0.1
	tls $SG_WORK/localhost.crt $SG_WORK/localhost.key
	reverse_proxy 127.0.0.1:$BACKEND
}
CONF

# start KIND: the proxy, pinned to core 0; its pid in SPAWNED, its port in PORT.
start() {
  case $1 in
    shardgate) start_proxy shardgate "$SG_WORK/shardgate.yaml" $SG $ADMIN; PORT=$SG ;;
    caddy)
      spawn caddy INT env GOMAXPROCS=1 HOME="$SG_WORK" XDG_DATA_HOME="$SG_WORK" XDG_CONFIG_HOME="$SG_WORK" \
        taskset -c 0 caddy run --adapter caddyfile --config "$SG_WORK/Caddyfile"
      wait_tcp $CADDY "$SPAWNED" caddy
      PORT=$CADDY
      ;;
  esac
  sleep 0.3
}

h3() { taskset -c 1 "$H3LOAD" "127.0.0.1:$PORT" localhost "$@"; }

declare -A CPU=()
# load KIND NAME ARGS...: CPU µs per request of the proxy under h3load ARGS.
load() {
  local kind=$1 name=$2 pid pids before after out requests errors
  shift 2
  start "$kind"
  pid=$SPAWNED
  h3 / --conns 4 --streams 4 --secs 1 "$@" >/dev/null
  read -r -a pids <<<"$(family "$pid")"
  before=$(cpu_ticks "${pids[@]}")
  out=$(h3 / --conns "$CONNS" --streams "$STREAMS" --secs "$SECS" "$@")
  after=$(cpu_ticks "${pids[@]}")
  stop "$pid"
  read -r _ requests _ errors _ <<<"$out"
  [[ $errors == 0 ]] || printf '  (%s %s: %s errors)\n' "$kind" "$name" "$errors"
  local us
  us=$(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v n="$requests" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
  printf '  %-9s %-22s %8s req  %7s µs CPU/request\n' "$kind" "$name" "$requests" "$us"
  CPU["$kind $name"]+="$us "
}

# h2 NAME ARGS...: shardgate's CPU µs per request over HTTP/2 with TLS.
h2() {
  local name=$1 pid pids before after out requests
  shift
  start shardgate
  pid=$SPAWNED
  taskset -c 1 h2load -c 4 -m 4 -D 1 "$@" "https://localhost:$SG/" >/dev/null 2>&1 || true
  read -r -a pids <<<"$(family "$pid")"
  before=$(cpu_ticks "${pids[@]}")
  out=$(taskset -c 1 h2load -c "$CONNS" -m "$STREAMS" -D "$SECS" "$@" "https://localhost:$SG/" 2>&1)
  after=$(cpu_ticks "${pids[@]}")
  stop "$pid"
  requests=$(awk '/^requests:/ { print $8 }' <<<"$out")
  local us
  us=$(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v n="$requests" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
  printf '  %-9s %-22s %8s req  %7s µs CPU/request\n' shardgate "$name" "$requests" "$us"
  CPU["shardgate $name"]+="$us "
}

# idle KIND: KiB of the proxy's RSS per idle HTTP/3 connection.
declare -A IDLE_KIB=()
idle() {
  local kind=$1 pid pids before after
  start "$kind"
  pid=$SPAWNED
  h3 / --conns 8 --streams 1 --requests 1 --secs 5 >/dev/null
  read -r -a pids <<<"$(family "$pid")"
  before=$(status_kib VmRSS "${pids[@]}")
  h3 / --conns "$IDLE" --streams 1 --requests 1 --secs 30 --hold 4 >"$SG_WORK/idle.out" &
  local client=$!
  sleep 3
  after=$(status_kib VmRSS "${pids[@]}")
  wait "$client" || true
  stop "$pid"
  local per
  per=$(awk -v a="$after" -v b="$before" -v n="$IDLE" 'BEGIN { printf "%.1f", (a - b) / n }')
  printf '  %-9s %5s idle connections: %6s KiB RSS more, %5s KiB each\n' "$kind" "$IDLE" $((after - before)) "$per"
  IDLE_KIB[$kind]+="$per "
}

printf 'HTTP/3: %s, commit %s; %s, caddy %s\n' "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" \
  "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" "$(nginx -v 2>&1)" "$(caddy version | cut -d' ' -f1)"
printf '  %s connections x %s streams, %s s per run, proxies on core 0 with one thread\n' "$CONNS" "$STREAMS" "$SECS"
for ((r = 1; r <= ROUNDS * LOAD; r++)); do
  printf 'round %s/%s\n' "$r" "$ROUNDS"
  if ((r % 2)); then order=(shardgate caddy); else order=(caddy shardgate); fi
  for kind in "${order[@]}"; do load "$kind" "h3 GET"; done
  for kind in "${order[@]}"; do load "$kind" "h3 POST 1 KiB" --body 1024; done
  h2 "h2+TLS GET"
  h2 "h2+TLS POST 1 KiB" -d "$SG_WORK/post.body"
done
if [[ $LOAD == 1 ]]; then for kind in shardgate caddy; do idle "$kind"; done; fi

median() { tr ' ' '\n' | sort -n | awk 'NF { v[++n] = $1 } END { m = v[int((n + 1) / 2)]; printf "%s (%s-%s)", m, v[1], v[n] }'; }
med() { tr ' ' '\n' | sort -n | awk 'NF { v[++n] = $1 } END { print v[int((n + 1) / 2)] }'; }
if [[ $LOAD == 1 ]]; then
printf '\n%-32s %s\n' "CPU µs per request" "median (min-max)"
for key in "shardgate h3 GET" "caddy h3 GET" "shardgate h2+TLS GET" "shardgate h3 POST 1 KiB" "caddy h3 POST 1 KiB" "shardgate h2+TLS POST 1 KiB"; do
  printf '%-32s %s\n' "$key" "$(median <<<"${CPU[$key]}")"
done
for shape in "GET" "POST 1 KiB"; do
  sg=$(med <<<"${CPU["shardgate h3 $shape"]}")
  printf 'h3 %-10s shardgate / caddy %s, shardgate h3 / h2+TLS %s\n' "$shape" \
    "$(awk -v a="$sg" -v b="$(med <<<"${CPU["caddy h3 $shape"]}")" 'BEGIN { printf "%.2f", a / b }')" \
    "$(awk -v a="$sg" -v b="$(med <<<"${CPU["shardgate h2+TLS $shape"]}")" 'BEGIN { printf "%.2f", a / b }')"
done
printf 'idle HTTP/3 connection: shardgate %s KiB, caddy %s KiB\n' "${IDLE_KIB[shardgate]}" "${IDLE_KIB[caddy]}"
fi

# big PROTO: one 1 GiB download through shardgate over HTTP/3 (h3load) or
# HTTP/2 (curl): "MB/s cpu_ms_per_GiB".
big() {
  local pid=$1 proto=$2 before after begun ended
  before=$(cpu_ticks "$pid")
  begun=$(date +%s.%N)
  case $proto in
    h3) h3 /big --conns 1 --streams 1 --requests 1 --secs 300 >/dev/null ;;
    h2) taskset -c 1 curl -sk --http2 -o /dev/null "https://localhost:$SG/big" ;;
  esac
  ended=$(date +%s.%N)
  after=$(cpu_ticks "$pid")
  awk -v a="$begun" -v b="$ended" -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "%.0f %.0f\n", 1024 / (b - a), t * 1000 / hz }'
}

if [[ $BIG == 1 ]]; then
  start shardgate
  pid=$SPAWNED
  declare -A RATE=() BIGCPU=()
  for ((r = 1; r <= ROUNDS; r++)); do
    for proto in h3 h2; do
      read -r rate cpu <<<"$(big "$pid" "$proto")"
      printf '  1 GiB over %s: %s MB/s, shardgate %s ms CPU\n' "$proto" "$rate" "$cpu"
      RATE[$proto]+="$rate "
      BIGCPU[$proto]+="$cpu "
    done
  done
  stop "$pid"
  for proto in h3 h2; do
    printf '1 GiB download over %s: %s MB/s, shardgate CPU %s ms per GiB\n' "$proto" \
      "$(median <<<"${RATE[$proto]}")" "$(median <<<"${BIGCPU[$proto]}")"
  done
fi
