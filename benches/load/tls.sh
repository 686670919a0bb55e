#!/usr/bin/env bash
# TLS at the edge: shardgate vs nginx vs HAProxy, same certificate (ECDSA
# P-256), same backend, TLS 1.3 (1.2 allowed).
#
# One nginx backend (`200 ok\n`); each proxy in turn, fresh per run, pinned
# to core 0 (shardgate `threads: 1`, nginx one worker, HAProxy one
# thread), the load tool on core 1, over ROUNDS rounds (order rotated from
# round to round):
#   full      full handshakes (openssl s_time -new), each with one GET /
#   resumed   resumed handshakes (openssl s_time -reuse: session tickets),
#             each with one GET / (the client must read to get its ticket)
#   https1    keep-alive HTTPS/1.1 requests (wrk, CONNS connections)
#   h2        HTTP/2 requests (h2load, CONNS connections x 10 streams)
# For each: operations/s, the proxy's CPU per operation (clock ticks from
# /proc) split into user and system time, medians, the ratio to nginx,
# and each round's CPU over the lower of that round's nginx and HAProxy
# runs (median, with a distribution-free interval of at least 95 % from
# 6 rounds on: ROUNDS=7 for issue 40's rig).
#
#   bash benches/load/tls.sh [--build]
#
# Environment (defaults): SHARDGATE_BIN=target/release/shardgate, BUILD=0,
# ROUNDS=3, SECS=8, CONNS=32, CASES="full resumed https1 h2",
# PROXIES="shardgate nginx haproxy", KEEP=0. Ports: backend 18301,
# shardgate 18443 (admin 18490), nginx 18444, HAProxy 18445; 127.0.0.1
# only.
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
PROXIES=${PROXIES:-shardgate nginx haproxy}
for p in $PROXIES; do
  case $p in shardgate | nginx | haproxy) ;; *) die "unknown proxy '$p' in PROXIES (shardgate, nginx, haproxy)" ;; esac
done
for t in nginx openssl wrk h2load taskset curl python3; do
  command -v "$t" >/dev/null || die "$t is needed (Debian: apt-get install nginx-light openssl wrk nghttp2-client curl python3)"
done
if [[ " $PROXIES " == *" haproxy "* ]]; then
  command -v haproxy >/dev/null || die "haproxy is needed (Debian: apt-get install haproxy), or leave it out of PROXIES"
fi
resolve_shardgate_bin "$root" "$caller"
cd "$root"
lib_init
check_ports_free 18301 18443 18444 18445 18490
work=$SG_WORK

# The certificate all three serve: ECDSA P-256, for *.localhost.
mkdir -p "$work/certs"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
  -subj "/CN=bench" -addext "subjectAltName=DNS:*.localhost,DNS:localhost" \
  -keyout "$work/certs/bench.key" -out "$work/certs/bench.crt" 2>/dev/null
cat "$work/certs/bench.crt" "$work/certs/bench.key" >"$work/bench.pem"

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

HAPROXY_TLS=$work/bench.pem write_haproxy_conf "$work/haproxy.cfg" 18445 8192 18301

results="$work/results.tsv"
: >"$results"

start() { # start KIND -> port in PORT, pid family in FAM
  case $1 in
    shardgate) start_proxy shardgate "$work/shardgate.yaml" 18443 18490; PORT=18443 ;;
    nginx) start_proxy nginx "$work/nginx.conf" 18444; PORT=18444 ;;
    haproxy) start_proxy haproxy "$work/haproxy.cfg" 18445; PORT=18445 ;;
  esac
  PID=$SPAWNED
  sleep 0.3
  read -r -a FAM <<<"$(family "$PID")"
}

# measure ROUND KIND CASE: one run; appends "round kind case ops user
# sys" (ticks).
measure() {
  local round=$1 kind=$2 case=$3 out ops u0 s0 u1 s1
  start "$kind"
  local url="https://127.0.0.1:$PORT/"
  read -r u0 s0 <<<"$(cpu_ticks_split "${FAM[@]}")"
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
  read -r u1 s1 <<<"$(cpu_ticks_split "${FAM[@]}")"
  stop "$PID"
  [[ -n ${ops:-} && $ops -gt 0 ]] || { printf '%s\n' "$out" | tail -5 >&2; die "$kind $case: no operations counted"; }
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$kind" "$case" "$ops" "$((u1 - u0))" "$((s1 - s0))" >>"$results"
  printf '  %-9s %-8s %9s ops  %5s ticks\n' "$kind" "$case" "$ops" "$((u1 - u0 + s1 - s0))"
}

read -r -a proxies <<<"$PROXIES"
for ((r = 1; r <= ROUNDS; r++)); do
  printf 'round %d\n' "$r"
  for case in $CASES; do
    for ((k = 0; k < ${#proxies[@]}; k++)); do
      measure "$r" "${proxies[(k + r - 1) % ${#proxies[@]}]}" "$case"
    done
  done
done

python3 - "$results" "$SECS" "$(getconf CLK_TCK)" "$here" <<'EOF'
import statistics
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the repository
sys.path.insert(0, sys.argv[4])
from paired import lower_ratios, median_ci, spread

secs, hz = float(sys.argv[2]), int(sys.argv[3])
runs = {}  # (case, proxy) -> {round: (ops/s, CPU us/op, user us/op)}
for line in open(sys.argv[1]).read().split("\n"):
    if not line:
        continue
    r, kind, case, ops, user, sys_ = line.split("\t")
    ops, user, sys_ = int(ops), int(user), int(sys_)
    us = lambda t: t / hz * 1e6 / ops
    runs.setdefault((case, kind), {})[int(r)] = (ops / secs, us(user + sys_), us(user))
head = ["case", "proxy", "ops/s", "CPU us/op", "user+sys", "CPU / nginx",
        "CPU / lower of nginx, HAProxy [95% CI]"]
table = [head]
for case in ["full", "resumed", "https1", "h2"]:
    ngx = {r: v[1] for r, v in runs.get((case, "nginx"), {}).items()}
    hap = {r: v[1] for r, v in runs.get((case, "haproxy"), {}).items()}
    for kind in ["shardgate", "nginx", "haproxy"]:
        rs = runs.get((case, kind))
        if not rs:
            continue
        cpu = {r: v[1] for r, v in rs.items()}
        user = statistics.median(v[2] for v in rs.values())
        sys_ = statistics.median(v[1] - v[2] for v in rs.values())
        to_nginx = [c / ngx[r] for r, c in cpu.items() if r in ngx and ngx[r]]
        table.append([
            case, kind,
            spread([v[0] for v in rs.values()], "{:.0f}"),
            spread(list(cpu.values()), "{:.2f}"),
            f"{user:.2f}+{sys_:.2f}",
            "-" if kind == "nginx" else spread(to_nginx, "{:.2f}"),
            "-" if kind != "shardgate" else median_ci(lower_ratios(cpu, ngx, hap), "{:.2f}"),
        ])
widths = [max(len(row[i]) for row in table) for i in range(len(head))]
print()
for row in table:
    print("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(row, widths))).rstrip())
print("""
Medians over the rounds (min-max). CPU us/op: the proxy's utime+stime per
operation (a handshake with its GET, or a request); user+sys: its medians
apart. CPU / nginx: the median of the per-round ratios. CPU / lower of
nginx, HAProxy: each round's CPU over the lower of that round's nginx and
HAProxy runs; the median, and in brackets an interval holding the true
median with at least 95 % (from 6 rounds on; fewer: min-max).""")
EOF
