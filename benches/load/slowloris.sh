#!/usr/bin/env bash
# Silent sockets and HTTP/2 rapid reset: shardgate vs nginx, side by side
# (issue 23). Loopback only; stops by itself.
#
# One nginx backend (`200 ok\n`; it logs every request for /rapid-reset,
# so the reset streams that reached it are counted). For each proxy in
# PROXIES, started fresh and pinned to core 0, with the same certificate
# (self-signed, ECDSA P-256), the same timeouts and the same HTTP/2 stream
# limit:
#   shardgate  a plain and a TLS listener (ALPN h2, http/1.1),
#              limits.keepalive_timeout_ms = limits.header_timeout_ms = TIMEOUT_MS,
#              tls.h2_max_concurrent_streams 128, no rate limit to speak of
#   nginx      `listen … ssl http2` and a plain listener, client_header_timeout
#              and keepalive_timeout TIMEOUT_MS, http2_max_concurrent_streams 128
#              (nginx ≥ 1.19.7 times a silent HTTP/2 connection with
#              client_header_timeout and keepalive_timeout), keepalive_requests
#              at its default (1 000)
# for SECS seconds, at once:
#   - SLOW silent sockets (edge_probe.py slowloris), a third each plain, TLS
#     with ALPN http/1.1 and TLS with ALPN h2: connect, finish the
#     handshake, send nothing, time until the proxy closes them, open again
#     at once (first openings spread over TIMEOUT_MS);
#   - an HTTP/2 rapid-reset client (edge_probe.py rapid-reset): HEADERS
#     (GET /rapid-reset, END_STREAM) + RST_STREAM (CANCEL) pairs until
#     GOAWAY or close, then a new connection.
# Prints per proxy: silent-socket close times p50 / p99 / max per kind,
# sockets that stayed open past TIMEOUT_MS + 1 s (closed late, or still
# open at the end), the rapid-reset streams sent per connection before
# GOAWAY or close and the GOAWAY's last stream id, how connections ended,
# and the reset streams that reached the backend. Exit 1 when shardgate
# misses a bound (a silent socket past the limit, a reset stream at the
# backend).
#
#   bash benches/load/slowloris.sh                    # 2 × 30 s
#   SECS=10 SLOW=600 bash benches/load/slowloris.sh   # a quick look
#   PROXIES=shardgate bash benches/load/slowloris.sh
#
# Environment (defaults): SECS=30, SLOW=5000, TIMEOUT_MS=5000,
# PROXIES="shardgate nginx", THREADS=1 (shardgate threads, nginx workers),
# SHARDGATE_BIN=target/release/shardgate, BUILD=0 (or --build), KEEP=0.
# Ports: backend 18701, shardgate 18780 (TLS 18743, admin 18790), nginx
# 18781 (TLS 18744); 127.0.0.1 only.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
caller=$PWD
# shellcheck source=lib.sh
source "$here/lib.sh"
# shellcheck source=edge-lib.sh
source "$here/edge-lib.sh"
parse_args "$0" "$@"

SECS=${SECS:-30}
SLOW=${SLOW:-5000}
TIMEOUT_MS=${TIMEOUT_MS:-5000}
PROXIES=${PROXIES:-"shardgate nginx"}
THREADS=${THREADS:-1}
for v in SECS TIMEOUT_MS THREADS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
[[ $SLOW =~ ^[0-9]+$ ]] || die "SLOW must be a non-negative integer (got '$SLOW')"
for p in $PROXIES; do
  case $p in shardgate | nginx) ;; *) die "unknown proxy '$p' in PROXIES (shardgate, nginx)" ;; esac
done
for t in nginx openssl curl python3 taskset ss pgrep; do
  command -v "$t" >/dev/null || die "$t is needed (Debian: apt-get install nginx-light openssl curl python3 util-linux iproute2 procps)"
done
if [[ " $PROXIES " == *" shardgate "* ]]; then
  resolve_shardgate_bin "$root" "$caller"
fi
cd "$root"
raise_nofile $((SLOW + 4096))

BACKEND=18701 SG_PLAIN=18780 SG_TLS=18743 SG_ADMIN=18790 NG_PLAIN=18781 NG_TLS=18744
check_ports_free "$BACKEND" "$SG_PLAIN" "$SG_TLS" "$SG_ADMIN" "$NG_PLAIN" "$NG_TLS"
LIMIT_MS=$((TIMEOUT_MS + 1000))

lib_init
work=$SG_WORK
echo "silent sockets and rapid reset: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if [[ " $PROXIES " == *" shardgate "* ]]; then
  echo "  shardgate: $SHARDGATE_BIN (built $(date -u -r "$SHARDGATE_BIN" '+%Y-%m-%d %H:%M UTC'))"
fi
echo "  $(nginx -v 2>&1); $SLOW silent sockets (plain / TLS HTTP/1.1 / TLS h2) + one rapid-reset client," \
  "${SECS} s per proxy; timeouts ${TIMEOUT_MS} ms (limit $LIMIT_MS ms); proxies on core 0, $THREADS thread(s)/worker(s)"
echo

make_cert "$work/certs" bench
write_counting_backend_conf "$work/backend" "$BACKEND"
spawn backend TERM nginx -p "$work/backend/" -c "$work/backend/nginx.conf" -e "$work/backend/error.log"
wait_tcp "$BACKEND" "$SPAWNED" backend

cat >"$work/shardgate.yaml" <<EOF
server: { threads: $THREADS, pid_file: $work/shardgate.pid, upgrade_sock: $work/shardgate.sock, grace_period_seconds: 1, graceful_shutdown_timeout_seconds: 1 }
listen:
  - { addr: "127.0.0.1:$SG_PLAIN" }
  - { addr: "127.0.0.1:$SG_TLS", tls: true }
admin: { addr: "127.0.0.1:$SG_ADMIN" }
state: false
tls: { certs: $work/certs, default_cert: bench, alpn: [h2, http/1.1], h2_max_concurrent_streams: 128 }
shards: [{ id: s1, url: "http://127.0.0.1:$BACKEND" }]
limits:
  connection_cap: 100000
  rate: { tokens: 1000000000, refill_per_second: 1000000000 }
  keepalive_timeout_ms: $TIMEOUT_MS
  header_timeout_ms: $TIMEOUT_MS
domains: { fallback_suffix: .localhost }
log: { access: off }
EOF

mkdir -p "$work/nginx-tmp"
cat >"$work/nginx.conf" <<EOF
worker_processes $THREADS;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
worker_rlimit_nofile $((2 * SLOW + 4096));
events { worker_connections $((2 * SLOW + 2048)); }
http {
$(nginx_paths "$work" nginx)
    access_log off;
    client_header_timeout ${TIMEOUT_MS}ms;
    keepalive_timeout ${TIMEOUT_MS}ms;
    http2_max_concurrent_streams 128;
    upstream shards { server 127.0.0.1:$BACKEND; keepalive 1024; }
    server {
        listen 127.0.0.1:$NG_PLAIN backlog=4096;
        listen 127.0.0.1:$NG_TLS ssl http2 backlog=4096;
        ssl_certificate $work/certs/bench.crt;
        ssl_certificate_key $work/certs/bench.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        location / {
            proxy_pass http://shards;
            proxy_http_version 1.1;
            proxy_set_header Host \$host;
            proxy_set_header Connection "";
        }
    }
}
EOF

: >"$work/results.tsv"
# probe PROXY: one run; appends "proxy <tab> kind <tab> json" rows.
probe() {
  local proxy=$1 plain tls pid fam=() before after hwm i
  case $proxy in
    shardgate)
      plain=$SG_PLAIN tls=$SG_TLS
      start_proxy shardgate "$work/shardgate.yaml" "$plain" "$SG_ADMIN"
      wait_tcp "$tls" "$SPAWNED" shardgate
      ;;
    nginx)
      plain=$NG_PLAIN tls=$NG_TLS
      start_proxy nginx "$work/nginx.conf" "$plain"
      wait_tcp "$tls" "$SPAWNED" nginx
      ;;
  esac
  pid=$SPAWNED
  sleep 0.3
  read -r -a fam <<<"$(family "$pid")"
  before=$(rapid_count "$work/backend")
  start_slowloris "$proxy-slow" "$plain" "$tls" "$SLOW" "$SECS" "$LIMIT_MS" "$TIMEOUT_MS"
  spawn "$proxy-rapid" TERM python3 "$here/edge_probe.py" rapid-reset --target "127.0.0.1:$tls" \
    --authority rapid.localhost --path /rapid-reset --duration "$SECS"
  local rapid=$SPAWNED
  local t
  for ((t = 1; t <= SECS; t++)); do
    sleep 1
    alive "$pid" || { log_tail "$proxy"; die "$proxy exited during the run"; }
    if ((t % 10 == 0 || t == SECS)); then
      printf '  %-9s t=%3ss  silent sockets open (plain/TLS/h2) %s  RSS %.1f MiB\n' "$proxy" "$t" \
        "$(slow_open "$proxy-slow")" "$(awk -v k="$(status_kib VmRSS "${fam[@]}")" 'BEGIN { print k / 1024 }')"
    fi
  done
  for i in "${!SLOW_PIDS[@]}"; do
    printf '%s\tslow\t%s\n' "$proxy" "$(wait_probe "${SLOW_PIDS[i]}" "${SLOW_NAMES[i]}" 30)" >>"$work/results.tsv"
  done
  printf '%s\trapid\t%s\n' "$proxy" "$(wait_probe "$rapid" "$proxy-rapid" 30)" >>"$work/results.tsv"
  sleep 1 # the backend logs a request when it ends
  after=$(rapid_count "$work/backend")
  hwm=$(status_kib VmHWM "${fam[@]}")
  printf '%s\treached\t{"reached": %d, "peak_rss_kib": %d}\n' "$proxy" $((after - before)) "$hwm" >>"$work/results.tsv"
  stop "$pid"
}

for proxy in $PROXIES; do probe "$proxy"; done

echo
python3 - "$work/results.tsv" "$LIMIT_MS" "$TIMEOUT_MS" <<'PY'
import json
import sys

path, limit, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
by = {}
for line in open(path):
    proxy, what, js = line.rstrip("\n").split("\t", 2)
    if not js.strip():
        continue
    by.setdefault(proxy, {}).setdefault(what, []).append(json.loads(js))

names = {"plain": "plain", "tls": "TLS/1.1", "h2": "TLS/h2"}
print(f"silent sockets: ms from the end of the handshake (plain: the connection) to the proxy's close;"
      f" limit {timeout} + 1000 = {limit} ms")
head = ["proxy", "kind", "sockets", "closed", "p50", "p99", "max", "past limit", "open at end",
        "handshake p50/p99", "from connect p99/max", "client lag p99/max", "late less lag (n, max)", "errors"]
rows = [head]
for proxy, d in by.items():
    for r in d.get("slow", []):
        hs = "-" if r["handshake_p50_ms"] is None else f"{r['handshake_p50_ms']}/{r['handshake_p99_ms']}"
        rows.append([proxy, names[r["kind"]], str(r["count"]), str(r["closed"]), str(r["close_p50_ms"]),
                     str(r["close_p99_ms"]), str(r["close_max_ms"]), str(r["closed_late"] + r["open_past_limit"]),
                     str(r["open_at_end"]), hs, f"{r['since_connect_p99_ms']}/{r['since_connect_max_ms']}",
                     f"{r['client_lag_p99_ms']}/{r['client_lag_max_ms']}",
                     f"{r['closed_late_less_lag']}, {r['close_max_less_lag_ms']}" if r["closed_late"] else "-",
                     str(sum(r["errors"].values()))])
w = [max(len(r[i]) for r in rows) for i in range(len(head))]
for r in rows:
    print("  " + "  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(r)))
print("  past limit: closed after the limit, or still open past it at the end; client lag: how late the"
      " probe's own event loop woke up (closes are seen up to that much late); late less lag: the late"
      " closes less the worst probe lag within 1 s of each (how many stay past the limit, and the max)")

print("\nHTTP/2 rapid reset (HEADERS + RST_STREAM pairs until GOAWAY or close)")
head = ["proxy", "conns", "streams sent", "sent/conn until GOAWAY/close seen (min/med/max)",
        "streams by GOAWAY last id (min/med/max)", "ended by", "reached backend", "peak RSS MiB"]
rows = [head]
fmt = lambda s: "-" if not s else f"{s['min']:g}/{s['median']:g}/{s['max']:g}"
for proxy, d in by.items():
    r = (d.get("rapid") or [{}])[0]
    x = (d.get("reached") or [{}])[0]
    if not r:
        rows.append([proxy, "no result"] + [""] * (len(head) - 2))
        continue
    ended = ", ".join(f"{k} {v['connections']}" for k, v in r["ended_by"].items())
    codes = ", ".join(f"{k} {v}" for k, v in r["goaway_errors"].items())
    rows.append([proxy, str(r["connections"]), str(r["streams_sent"]), fmt(r["sent_before_goaway_or_close"]),
                 fmt(r["goaway_last_stream_accepted"]), ended + (f" ({codes})" if codes else ""),
                 str(x.get("reached", "?")), f"{x.get('peak_rss_kib', 0) / 1024:.1f}"])
w = [max(len(r[i]) for r in rows) for i in range(len(head))]
for r in rows:
    print("  " + "  ".join(c.ljust(w[i]) if i in (0, 5) else c.rjust(w[i]) for i, c in enumerate(r)))
for proxy, d in by.items():
    r = (d.get("rapid") or [{}])[0]
    for how, v in (r.get("ended_by") or {}).items():
        print(f"  {proxy} {how}: {v['connections']} connections, streams sent {fmt(v['streams'])}, "
              f"lasting {fmt(v['seconds'])} s (min/med/max)")
    if r.get("responses") or r.get("errors"):
        print(f"  {proxy}: responses to reset streams {r.get('responses')}, errors {r.get('errors')}")

bad = []
sg = by.get("shardgate")
if sg:
    for r in sg.get("slow", []):
        if not r["closed"] or r["close_max_ms"] is None or r["close_max_ms"] > limit or r["open_past_limit"]:
            bad.append(f"{names[r['kind']]} silent sockets past {limit} ms (max {r['close_max_ms']} ms, "
                       f"{r['closed_late'] + r['open_past_limit']} past the limit)")
    reached = (sg.get("reached") or [{}])[0].get("reached")
    if reached:
        bad.append(f"{reached} reset streams reached the backend")
    print()
    if bad:
        print("shardgate FAIL: " + "; ".join(bad))
        sys.exit(1)
    print("shardgate PASS: every silent socket closed within the limit, no reset stream reached the backend")
PY
