#!/usr/bin/env bash
# gRPC unary calls over HTTP/2 with prior knowledge (h2c) on both sides:
# shardgate (`protocol: h2` shard) vs nginx (`grpc_pass`) vs HAProxy
# (`proto h2` on both sides), in front of the same native backend
# (examples/grpc_echo.rs, the h2 crate: every call echoed, `grpc-status: 0`
# in trailers). h2load sends the calls (a 5-byte gRPC frame header and a
# 16-byte message, `te: trailers`) on CONNS connections with STREAMS calls
# in flight on each. Proxies are pinned to core 0; h2load and the backend
# to core 1. Interleaved over ROUNDS rounds; prints medians (min-max) of
# calls/s, p50/p99 latency (from h2load's per-request log), the proxy's CPU
# per 1 000 calls, the connections it had open to the backend at the end
# of the run, and the ratios to nginx.
#
# CLIENT=h1: the same calls from HTTP/1.1 clients (wrk, SECS seconds,
# one call in flight per connection: CASES="32x1" is 32 connections; h2load
# --h1 refuses HAProxy's status line, which has no reason phrase) to the
# HTTP/2 shard, against HAProxy doing the same (nginx cannot: grpc_pass
# takes HTTP/2 clients only); ratios to HAProxy then.
#
#   bash benches/load/grpc.sh [--build]
#   CLIENT=h1 CASES=32x1 bash benches/load/grpc.sh
#
# Environment (defaults):
#   SHARDGATE_BIN=target/release/shardgate
#   ECHO_BIN=target/release/examples/grpc_echo
#   BUILD=0          1 (or --build): build both first
#   ROUNDS=3         rounds
#   CALLS=40000      calls per run
#   CASES="1x32 8x32"   CONNSxSTREAMS per connection (32 and 256 in flight)
#   PROXIES="shardgate nginx haproxy"   (CLIENT=h1: "shardgate haproxy")
#   CLIENT=h2        h2 or h1
#   SECS=5           seconds per run with CLIENT=h1
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CALLER=$PWD
# shellcheck source=benches/load/lib.sh
source "$HERE/lib.sh"
parse_args "$0" "$@"
ROUNDS=${ROUNDS:-3}
CALLS=${CALLS:-40000}
CLIENT=${CLIENT:-h2}
case $CLIENT in
  h2) CASES=${CASES:-"1x32 8x32"} PROXIES=${PROXIES:-"shardgate nginx haproxy"} BASE=nginx ;;
  h1) CASES=${CASES:-"32x1"} PROXIES=${PROXIES:-"shardgate haproxy"} BASE=haproxy ;;
  *) die "CLIENT is h2 or h1" ;;
esac
ECHO_BIN=${ECHO_BIN:-$ROOT/target/release/examples/grpc_echo}
if [[ ${BUILD:-0} == 1 ]]; then
  (cd "$ROOT" && cargo build --release --example grpc_echo)
fi
resolve_shardgate_bin "$ROOT" "$CALLER"
[[ -x $ECHO_BIN ]] || die "no backend at $ECHO_BIN (cargo build --release --example grpc_echo, or --build)"
command -v h2load >/dev/null || die "h2load is missing (apt-get install nghttp2-client)"
lib_init

BACKEND=18201 PORT=18280 ADMIN=18281
check_ports_free $BACKEND $PORT $ADMIN
spawn backend TERM taskset -c 1 "$ECHO_BIN" 127.0.0.1:$BACKEND 1
wait_tcp $BACKEND "$SPAWNED" backend
# One call: the gRPC frame header (not compressed, length 16), the message.
printf '\x00\x00\x00\x00\x10%s' 0123456789abcdef >"$SG_WORK/call.bin"
cat >"$SG_WORK/call.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "\0\0\0\0\16" .. "0123456789abcdef"
wrk.headers["content-type"] = "application/grpc"
wrk.headers["te"] = "trailers"
LUA

write_grpc_confs "$SG_WORK" $PORT $ADMIN $BACKEND "$CLIENT"

declare -A RESULTS=()
run_one() {
  local proxy=$1 case=$2 conns streams conf pids before after out rps p50 p99 cpu
  conns=${case%x*} streams=${case#*x}
  case $proxy in
    shardgate) conf=$SG_WORK/shardgate.yaml ;;
    nginx) conf=$SG_WORK/nginx.conf ;;
    haproxy) conf=$SG_WORK/haproxy.cfg ;;
    *) die "unknown proxy $proxy" ;;
  esac
  start_proxy "$proxy" "$conf" $PORT $ADMIN
  local pid=$SPAWNED upstream
  # Warm up (connections, pools), then the measured run.
  if [[ $CLIENT == h1 ]]; then
    taskset -c 1 wrk -t1 -c "$conns" -d 1s -s "$SG_WORK/call.lua" \
      "http://localhost:$PORT/test.Echo/Unary" >/dev/null 2>&1 || true
  else
    taskset -c 1 h2load -n 2000 -c "$conns" -m "$streams" -d "$SG_WORK/call.bin" \
      -H 'content-type: application/grpc' -H 'te: trailers' \
      "http://localhost:$PORT/test.Echo/Unary" >/dev/null 2>&1 || true
  fi
  read -r -a pids <<<"$(family "$pid")"
  before=$(cpu_ticks "${pids[@]}")
  local calls=$CALLS
  if [[ $CLIENT == h1 ]]; then
    out=$(taskset -c 1 wrk -t1 -c "$conns" -d "${SECS:-5}s" -s "$SG_WORK/call.lua" --latency \
      "http://localhost:$PORT/test.Echo/Unary" 2>&1)
  else
    out=$(taskset -c 1 h2load -n "$CALLS" -c "$conns" -m "$streams" -d "$SG_WORK/call.bin" \
      -H 'content-type: application/grpc' -H 'te: trailers' \
      --log-file="$SG_WORK/h2load.log" "http://localhost:$PORT/test.Echo/Unary" 2>&1)
  fi
  after=$(cpu_ticks "${pids[@]}")
  # The proxy's connections to the backend (the h2 shard), still open.
  upstream=$(ss -Htn state established "( dport = :$BACKEND )" | wc -l)
  stop "$pid"
  if [[ $CLIENT == h1 ]]; then
    calls=$(awk '/requests in/ { print $1 }' <<<"$out")
    ! grep -q 'Non-2xx' <<<"$out" || { printf '%s\n' "$out" >&2; die "$proxy: answers other than 2xx"; }
    rps=$(awk '/^Requests\/sec:/ { print int($2) }' <<<"$out")
    # wrk's percentiles, in ms whatever unit it printed.
    read -r p50 p99 < <(awk '$1 == "50%" || $1 == "99%" { v = $2 + 0; if ($2 ~ /us$/) v /= 1000; else if ($2 ~ /[^m]s$/) v *= 1000; printf "%.2f ", v } END { print "" }' <<<"$out")
  else
    rps=$(awk '/^finished in/ { print int($4) }' <<<"$out")
    local ok
    ok=$(awk '/^status codes:/ { print $3 }' <<<"$out")
    [[ ${ok:-0} -eq $CALLS ]] || { printf '%s\n' "$out" >&2; die "$proxy: $ok of $CALLS calls got 2xx"; }
    # Per-call latency, µs (the log's third column), sorted.
    read -r p50 p99 < <(awk '{ print $3 }' "$SG_WORK/h2load.log" | sort -n |
      awk '{ v[NR] = $1 } END { printf "%.2f %.2f\n", v[int(NR * 0.5)] / 1000, v[int(NR * 0.99)] / 1000 }')
  fi
  cpu=$(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v n="$calls" 'BEGIN { printf "%.2f", t * 1000 / hz / n * 1000 }')
  printf '%-5s %-9s %-10s %8s calls/s  p50 %6s ms  p99 %6s ms  CPU %6s ms/1k calls  %s upstream conns\n' \
    "$3" "$case" "$proxy" "$rps" "$p50" "$p99" "$cpu" "$upstream"
  RESULTS["$proxy $case"]+="$rps $p50 $p99 $cpu;"
}

printf 'gRPC unary, %s clients, h2c to the shard: %s, commit %s\n' "$CLIENT" "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
printf '  %s; %s; h2load %s\n' "$(nginx -v 2>&1)" "$(haproxy -v | head -1)" "$(h2load --version | head -1)"
read -r -a proxies <<<"$PROXIES"
for ((r = 1; r <= ROUNDS; r++)); do
  for case in $CASES; do
    n=${#proxies[@]}
    for ((k = 0; k < n; k++)); do
      run_one "${proxies[(k + r) % n]}" "$case" "$r/$ROUNDS"
    done
  done
done

# Medians (min-max) per proxy and case, and the ratios to nginx (HAProxy
# for CLIENT=h1).
median() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { m = v[int((NR + 1) / 2)]; printf "%s (%s-%s)", m, v[1], v[NR] }'; }
column_of() { tr ';' '\n' | awk -v c="$1" 'NF { printf "%s ", $c }'; }
printf '\n'
for case in $CASES; do
  printf '== %s (connections x calls in flight each) ==\n' "$case"
  printf '%-10s %-26s %-22s %-22s %-24s %s\n' proxy calls/s "p50 ms" "p99 ms" "CPU ms/1k calls" "CPU / $BASE"
  base_cpu=$(column_of 4 <<<"${RESULTS["$BASE $case"]:-}" | tr ' ' '\n' | sort -n | awk 'NF { v[++n] = $1 } END { if (n) print v[int((n + 1) / 2)] }')
  for proxy in "${proxies[@]}"; do
    rows=${RESULTS["$proxy $case"]:-}
    [[ -n $rows ]] || continue
    cpu_med=$(column_of 4 <<<"$rows" | tr ' ' '\n' | sort -n | awk 'NF { v[++n] = $1 } END { print v[int((n + 1) / 2)] }')
    ratio=-
    [[ -n ${base_cpu:-} ]] && ratio=$(awk -v a="$cpu_med" -v b="$base_cpu" 'BEGIN { printf "%.2f", a / b }')
    printf '%-10s %-26s %-22s %-22s %-24s %s\n' "$proxy" \
      "$(column_of 1 <<<"$rows" | median)" "$(column_of 2 <<<"$rows" | median)" \
      "$(column_of 3 <<<"$rows" | median)" "$(column_of 4 <<<"$rows" | median)" "$ratio"
  done
  printf '\n'
done
