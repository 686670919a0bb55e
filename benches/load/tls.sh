#!/usr/bin/env bash
# TLS at the edge: shardgate vs nginx, same certificate (ECDSA P-256), same
# backends, TLS 1.3.
#
# One nginx backend (`200 ok\n`); each proxy in turn, fresh per run, pinned
# to core 0 (shardgate `threads: 1`, nginx one worker), the load tool on
# core 1, over ROUNDS rounds (order alternating):
#   full      full handshakes (openssl s_time -new), each with one GET /
#   resumed   resumed handshakes (openssl s_time -reuse: session tickets),
#             each with one GET / (the client must read to get its ticket)
#   https1    keep-alive HTTPS/1.1 requests (wrk, CONNS connections)
#   h2        HTTP/2 requests (h2load, CONNS connections x 10 streams)
# For each: operations/s and the proxy's CPU per 1 000 operations (clock
# ticks from /proc), medians, and shardgate/nginx ratios.
#
#   bash benches/load/tls.sh [--build]
#
# Environment (defaults): SHARDGATE_BIN=target/release/shardgate, BUILD=0,
# ROUNDS=3, SECS=8, CONNS=32, CASES="full resumed https1 h2", KEEP=0. Ports: backend 18301, shardgate 18443
# (admin 18490), nginx 18444; 127.0.0.1 only.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
caller=$PWD
# shellcheck source=lib.sh
source "$here/lib.sh"
parse_args "$0" "$@"

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-8}
CONNS=${CONNS:-32}
CASES=${CASES:-full resumed https1 h2}
for t in nginx openssl wrk h2load taskset curl python3; do
  command -v "$t" >/dev/null || die "$t is needed (Debian: apt-get install nginx-light openssl wrk nghttp2-client curl python3)"
done
resolve_shardgate_bin "$root" "$caller"
cd "$root"
lib_init
check_ports_free 18301 18443 18444 18490
work=$SG_WORK

# The certificate both serve: ECDSA P-256, for *.localhost.
mkdir -p "$work/certs"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
  -subj "/CN=bench" -addext "subjectAltName=DNS:*.localhost,DNS:localhost" \
  -keyout "$work/certs/bench.key" -out "$work/certs/bench.crt" 2>/dev/null

write_backend_conf "$work/backend/nginx.conf" 18301
spawn backend TERM taskset -c 1 nginx -p "$work/backend/" -c "$work/backend/nginx.conf" -e "$work/backend/backend-error.log"
wait_tcp 18301 "$SPAWNED" backend

cat >"$work/shardgate.yaml" <<EOF
server: { threads: 1, pid_file: $work/shardgate.pid, upgrade_sock: $work/shardgate.sock }
listen: [{ addr: 127.0.0.1:18443, tls: true }]
admin: { addr: 127.0.0.1:18490 }
state: false
tls: { certs: $work/certs, default_cert: bench }
shards: [{ id: s1, url: "http://127.0.0.1:18301" }]
limits:
  connection_cap: 100000
  rate: { tokens: 1000000000, refill_per_second: 1000000000 }
domains: { fallback_suffix: .localhost }
log: { access: off }
EOF

mkdir -p "$work/nginx-tmp"
cat >"$work/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
worker_rlimit_nofile 16384;
events { worker_connections 8192; }
http {
$(nginx_paths "$work" nginx)
    access_log off;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    upstream shards { server 127.0.0.1:18301; keepalive 1024; }
    server {
        listen 127.0.0.1:18444 ssl http2 backlog=4096;
        ssl_certificate $work/certs/bench.crt;
        ssl_certificate_key $work/certs/bench.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:SSL:10m;
        ssl_session_tickets on;
        location / {
            proxy_pass http://shards;
            proxy_http_version 1.1;
            proxy_set_header Host \$host;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For \$remote_addr;
            proxy_set_header X-Forwarded-Proto \$scheme;
        }
    }
}
EOF

results="$work/results.tsv"
: >"$results"

start() { # start KIND -> port in PORT, pid family in FAM
  case $1 in
    shardgate) start_proxy shardgate "$work/shardgate.yaml" 18443 18490; PORT=18443 ;;
    nginx) start_proxy nginx "$work/nginx.conf" 18444; PORT=18444 ;;
  esac
  PID=$SPAWNED
  sleep 0.3
  read -r -a FAM <<<"$(family "$PID")"
}

# measure KIND CASE: one run; appends "kind case ops ticks".
measure() {
  local kind=$1 case=$2 out ops t0 t1
  start "$kind"
  local url="https://127.0.0.1:$PORT/"
  t0=$(cpu_ticks "${FAM[@]}")
  case $case in
    full | resumed)
      local flag=-new
      [[ $case == resumed ]] && flag=-reuse
      out=$(taskset -c 1 openssl s_time -connect "127.0.0.1:$PORT" $flag -www / -time "$SECS" -tls1_3 2>&1 || true)
      # "N connections in T real seconds": first line with "connections in" and "real"
      ops=$(grep -m1 -oE '^[0-9]+ connections in [0-9.]+s' <<<"$out" | awk '{print $1}')
      ;;
    https1)
      out=$(taskset -c 1 wrk -t1 -c "$CONNS" -d "${SECS}s" -H "Host: t1.localhost" "$url" 2>&1)
      ops=$(awk '/requests in/ {print $1}' <<<"$out")
      ;;
    h2)
      out=$(taskset -c 1 h2load -c "$CONNS" -m 10 -D "$SECS" -H ":authority: t1.localhost" "$url" 2>&1)
      ops=$(awk '/^requests:/ {print $8}' <<<"$out")
      ;;
  esac
  t1=$(cpu_ticks "${FAM[@]}")
  stop "$PID"
  [[ -n ${ops:-} && $ops -gt 0 ]] || { printf '%s\n' "$out" | tail -5 >&2; die "$kind $case: no operations counted"; }
  printf '%s\t%s\t%s\t%s\n' "$kind" "$case" "$ops" "$((t1 - t0))" >>"$results"
  printf '  %-9s %-8s %9s ops  %5s ticks\n' "$kind" "$case" "$ops" "$((t1 - t0))"
}

for ((r = 1; r <= ROUNDS; r++)); do
  printf 'round %d\n' "$r"
  for case in $CASES; do
    if ((r % 2)); then order="shardgate nginx"; else order="nginx shardgate"; fi
    for kind in $order; do measure "$kind" "$case"; done
  done
done

python3 - "$results" "$SECS" <<'EOF'
import sys, statistics
rows = [l.split('\t') for l in open(sys.argv[1]).read().split('\n') if l]
secs = float(sys.argv[2])
by = {}
for kind, case, ops, ticks in rows:
    by.setdefault((case, kind), []).append((int(ops), int(ticks)))
print(f"\n{'case':9} {'proxy':10} {'ops/s':>9} {'ticks/1k ops':>13}   (medians)")
for case in ['full', 'resumed', 'https1', 'h2']:
    med = {}
    for kind in ['shardgate', 'nginx']:
        runs = by.get((case, kind), [])
        if not runs:
            continue
        rate = statistics.median(o / secs for o, _ in runs)
        cpu = statistics.median(1000 * t / o for o, t in runs)
        med[kind] = cpu
        print(f"{case:9} {kind:10} {rate:9.0f} {cpu:13.2f}")
    if len(med) == 2 and med['nginx'] > 0:
        print(f"{case:9} {'ratio':10} {'':9} {med['shardgate'] / med['nginx']:13.2f}   shardgate/nginx CPU per op")
EOF
