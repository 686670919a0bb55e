#!/usr/bin/env bash
# Open-loop latency: what each proxy adds to the direct path at a fixed
# request rate.
#
# wrk is a closed loop: a slow response delays the next request, so its
# percentiles measure queueing, not the proxy. Here `oha -q RATE
# --latency-correction` sends at a fixed rate whatever the answers do and
# counts each request's latency from when it was due (no coordinated
# omission). Same rig as compare.sh: 4 nginx backends and the client on
# core 1, each proxy alone on core 0, started fresh for each run, runs
# interleaved over ROUNDS rounds. RATE defaults to half of nginx's
# saturation rate, measured first (wrk, 32 connections, 5 s, one host).
# Prints p50 / p99 / p99.9 per proxy (medians over the rounds, min-max)
# and the p99 added over the direct path.
#
#   bash benches/load/openloop.sh [--build]
#
# Environment (defaults):
#   SHARDGATE_BIN=target/release/shardgate   the gateway (relative: to the repo root)
#   BUILD=0          1 (or --build): cargo build --release --bin shardgate first
#   RATE=            requests/s (default: half of nginx's wrk saturation rate)
#   CONNS=32         oha's connections
#   SECS=10          seconds per run
#   ROUNDS=3         rounds (every proxy once per round, order rotated)
#   HOST=tenant-1.localhost   the Host header (oha keeps one host per run)
#   PROXIES="direct shardgate nginx haproxy"
#   OHA=oha          the oha binary (cargo install oha)
#   KEEP=0           1: keep the temporary directory
# Ports as compare.sh: backends 18101-18104, shardgate 18080 (admin 18090),
# nginx 18081, HAProxy 18082; all on 127.0.0.1.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
caller=$PWD
# shellcheck source=lib.sh
source "$here/lib.sh"

parse_args "$0" "$@"

RATE=${RATE:-}
CONNS=${CONNS:-32}
SECS=${SECS:-10}
ROUNDS=${ROUNDS:-3}
HOST=${HOST:-tenant-1.localhost}
PROXIES=${PROXIES:-"direct shardgate nginx haproxy"}
OHA=${OHA:-oha}
for v in CONNS SECS ROUNDS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
[[ -z $RATE || $RATE =~ ^[1-9][0-9]*$ ]] || die "RATE must be a positive integer (got '$RATE')"
for p in $PROXIES; do
  case $p in shardgate | nginx | haproxy | direct) ;; *) die "unknown proxy '$p' in PROXIES" ;; esac
done
command -v "$OHA" >/dev/null || die "oha is needed: cargo install oha (or OHA=/path/to/oha)"
for t in wrk nginx haproxy taskset curl python3; do
  command -v "$t" >/dev/null || die "$t is needed (Debian: apt-get install wrk nginx-light haproxy curl python3)"
done
(($(nproc) >= 2)) || die "needs 2 cores (proxies on core 0, client and backends on core 1)"
if [[ " $PROXIES " == *" shardgate "* ]]; then
  resolve_shardgate_bin "$root" "$caller"
fi
cd "$root"

SG_PORT=18080 SG_ADMIN=18090 NGINX_PORT=18081 HAPROXY_PORT=18082
backend_ports=(18101 18102 18103 18104)
check_ports_free "$SG_PORT" "$SG_ADMIN" "$NGINX_PORT" "$HAPROXY_PORT" "${backend_ports[@]}"
read -r -a proxies <<<"$PROXIES"

lib_init
write_backend_conf "$SG_WORK/backend.conf" "${backend_ports[@]}"
spawn backend TERM taskset -c 1 nginx -p "$SG_WORK/" -c "$SG_WORK/backend.conf" -e "$SG_WORK/backend-error.log"
for p in "${backend_ports[@]}"; do wait_tcp "$p" "$SPAWNED" backend; done
write_shardgate_conf "$SG_WORK/shardgate.yaml" "$SG_PORT" "$SG_ADMIN" "${backend_ports[@]}"
write_nginx_proxy_conf "$SG_WORK/nginx.conf" http "$NGINX_PORT" 4096 "${backend_ports[@]}"
write_haproxy_conf "$SG_WORK/haproxy.cfg" "$HAPROXY_PORT" 4096 "${backend_ports[@]}"

# start KIND: the proxy (or nothing for direct); its port in PORT.
start() {
  case $1 in
    shardgate) PORT=$SG_PORT && start_proxy shardgate "$SG_WORK/shardgate.yaml" "$PORT" "$SG_ADMIN" ;;
    nginx) PORT=$NGINX_PORT && start_proxy nginx "$SG_WORK/nginx.conf" "$PORT" ;;
    haproxy) PORT=$HAPROXY_PORT && start_proxy haproxy "$SG_WORK/haproxy.cfg" "$PORT" ;;
    direct) PORT=${backend_ports[0]} ;;
  esac
}

echo "open-loop latency: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "  $("$OHA" --version 2>&1 | head -n 1), $(nginx -v 2>&1), $(haproxy -v 2>/dev/null | head -n 1 | cut -d' ' -f1-3)"
if [[ -z $RATE ]]; then
  start nginx
  nginx_pid=$SPAWNED
  spawn wrk INT env HOSTS=1 taskset -c 1 wrk -t1 -c32 -d5s --timeout 5s -s "$here/report.lua" "http://127.0.0.1:$PORT/"
  wait "$SPAWNED" || true
  stop "$nginx_pid"
  line=$(grep '^WRK_RESULT ' "$SG_WORK/wrk.log" || true)
  [[ -n $line ]] || die "wrk gave no result for nginx's saturation rate"
  requests=$(sed -n 's/.* requests=\([0-9]*\).*/\1/p' <<<"$line")
  duration_us=$(sed -n 's/.* duration_us=\([0-9]*\).*/\1/p' <<<"$line")
  saturation=$((requests * 1000000 / duration_us))
  RATE=$((saturation / 2))
  echo "  nginx saturates at $saturation req/s here (wrk, 32 connections, 5 s): RATE = $RATE req/s"
fi
echo "  proxies on core 0; oha (-q $RATE, $CONNS connections, --latency-correction, Host: $HOST) and 4 backends on core 1"
echo "  $ROUNDS rounds x ${#proxies[@]} targets, ${SECS} s each"
echo

results=$SG_WORK/openloop.tsv
printf 'round\tproxy\trps\tp50_ms\tp99_ms\tp999_ms\tmax_ms\tsuccess\n' >"$results"
for ((round = 1; round <= ROUNDS; round++)); do
  for ((k = 0; k < ${#proxies[@]}; k++)); do
    proxy=${proxies[(k + round - 1) % ${#proxies[@]}]}
    start "$proxy"
    pid=$SPAWNED
    taskset -c 1 "$OHA" -z "${SECS}s" -q "$RATE" -c "$CONNS" --latency-correction --no-tui \
      --output-format json -H "Host: $HOST" "http://127.0.0.1:$PORT/" >"$SG_WORK/oha.json" 2>"$SG_WORK/oha.err" ||
      die "oha failed against $proxy: $(tail -n 3 "$SG_WORK/oha.err")"
    [[ $proxy == direct ]] || stop "$pid"
    python3 - "$SG_WORK/oha.json" "$round" "$proxy" >>"$results" <<'PY'
import json, sys
path, rnd, proxy = sys.argv[1:]
d = json.load(open(path))
s, p = d["summary"], d["latencyPercentiles"]
ms = lambda v: "%.3f" % ((v or 0) * 1000)
print("\t".join([rnd, proxy, "%.0f" % s["requestsPerSec"], ms(p["p50"]), ms(p["p99"]), ms(p["p99.9"]),
                 ms(s["slowest"]), "%.4f" % s["successRate"]]))
PY
    tail -n 1 "$results" | awk -F'\t' -v R="$ROUNDS" '{
      printf "round %d/%d  %-10s %7.0f req/s  p50 %6.3f ms  p99 %6.3f ms  p99.9 %6.3f ms  max %7.2f ms  success %.2f%%\n",
        $1, R, $2, $3, $4, $5, $6, $7, $8 * 100 }'
  done
done

echo
python3 - "$results" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
order = ["direct", "shardgate", "nginx", "haproxy"]
by = {}
for r in rows:
    by.setdefault(r["proxy"], {})[r["round"]] = r
def med(values):
    values = sorted(values)
    return "%.3f (%.3f-%.3f)" % (statistics.median(values), values[0], values[-1]) if len(values) > 1 else "%.3f" % values[0]
print("%-10s %9s %22s %22s %22s %22s %8s" % ("proxy", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "p99 added ms", "success"))
direct = by.get("direct", {})
for proxy in [p for p in order if p in by]:
    runs = by[proxy]
    col = lambda k: [float(r[k]) for r in runs.values()]
    added = [float(r["p99_ms"]) - float(direct[n]["p99_ms"]) for n, r in runs.items() if n in direct]
    print("%-10s %9.0f %22s %22s %22s %22s %7.2f%%" % (
        proxy, statistics.median(col("rps")), med(col("p50_ms")), med(col("p99_ms")), med(col("p999_ms")),
        med(added) if added and proxy != "direct" else "-", 100 * min(col("success"))))
print()
print("p99 added: the proxy's p99 minus the direct path's p99 of the same round;")
print("median over the rounds (min-max). Latencies are corrected for")
print("coordinated omission: counted from when each request was due.")
PY
