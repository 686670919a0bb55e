#!/usr/bin/env bash
# WebSocket relay cost: messages relayed through N open WebSockets to an
# echo backend, through shardgate, nginx and HAProxy in turn.
#
# The echo backend and the client are `examples/ws_relay.rs` (tokio +
# tungstenite), both on core 1; each proxy, fresh per run, on core 0
# (shardgate `threads: 1`, nginx one worker, HAProxy one thread). For each
# message size in SIZES, each proxy opens CONNS WebSockets, then every
# socket sends a binary message, waits for its echo, and sends the next,
# for SECS seconds. A round trip is two relays through the proxy (client
# to shard, shard to client). Reported: round trips/s, the proxy's CPU per
# 1 000 round trips (clock ticks from /proc), the p50 and p99 round trip,
# medians over ROUNDS rounds (order rotating), and ratios to nginx.
#
#   bash benches/load/ws-relay.sh [--build]
#
# Environment (defaults): SHARDGATE_BIN=target/release/shardgate, BUILD=0,
# ROUNDS=3, SECS=5, CONNS=50, SIZES="64 16384",
# PROXIES="shardgate nginx haproxy", KEEP=0. Ports: backend 18221-18224,
# shardgate 18280 (admin 18290), nginx 18281, HAProxy 18282; 127.0.0.1 only.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
caller=$PWD
# shellcheck source=lib.sh
source "$here/lib.sh"
parse_args "$0" "$@"

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
CONNS=${CONNS:-50}
SIZES=${SIZES:-"64 16384"}
PROXIES=${PROXIES:-"shardgate nginx haproxy"}
for v in ROUNDS SECS CONNS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
for t in nginx haproxy taskset curl python3; do
  command -v "$t" >/dev/null || die "$t is needed (Debian: apt-get install nginx-light haproxy curl python3)"
done
(($(nproc) >= 2)) || die "needs 2 cores (proxies on core 0, client and backend on core 1)"
resolve_shardgate_bin "$root" "$caller"
cd "$root"
relay=$root/target/release/examples/ws_relay
if [[ ${BUILD:-0} == 1 || ! -x $relay ]]; then
  cargo build --release --example ws_relay
fi
lib_init
SG_PORT=18280 SG_ADMIN=18290 NGINX_PORT=18281 HAPROXY_PORT=18282
backend_ports=(18221 18222 18223 18224)
check_ports_free "$SG_PORT" "$SG_ADMIN" "$NGINX_PORT" "$HAPROXY_PORT" "${backend_ports[@]}"
read -r -a proxies <<<"$PROXIES"

spawn ws-echo TERM taskset -c 1 "$relay" server "${backend_ports[@]}"
for p in "${backend_ports[@]}"; do wait_tcp "$p" "$SPAWNED" ws-echo; done

write_shardgate_conf "$SG_WORK/shardgate.yaml" "$SG_PORT" "$SG_ADMIN" "${backend_ports[@]}"
write_nginx_proxy_conf "$SG_WORK/nginx.conf" ws "$NGINX_PORT" $((CONNS + 1024)) "${backend_ports[@]}"
write_haproxy_conf "$SG_WORK/haproxy.cfg" "$HAPROXY_PORT" $((CONNS + 1024)) "${backend_ports[@]}"

echo "WebSocket relay: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "  $CONNS sockets, sizes $SIZES B, $SECS s per run, $ROUNDS round(s); proxies on core 0, client and backend on core 1"
results=$SG_WORK/relay.tsv
: >"$results"

measure() { # PROXY SIZE
  local proxy=$1 size=$2 port pid fam=() t0 t1 out line
  case $proxy in
    shardgate) port=$SG_PORT; start_proxy shardgate "$SG_WORK/shardgate.yaml" "$port" "$SG_ADMIN" ;;
    nginx) port=$NGINX_PORT; start_proxy nginx "$SG_WORK/nginx.conf" "$port" ;;
    haproxy) port=$HAPROXY_PORT; start_proxy haproxy "$SG_WORK/haproxy.cfg" "$port" ;;
  esac
  pid=$SPAWNED
  read -r -a fam <<<"$(family "$pid")"
  t0=$(cpu_ticks "${fam[@]}")
  out=$(taskset -c 1 "$relay" client "127.0.0.1:$port" "$CONNS" "$size" "$SECS" 2>&1 || true)
  t1=$(cpu_ticks "${fam[@]}")
  stop "$pid"
  line=$(grep '^RESULT ' <<<"$out" || true)
  [[ -n $line ]] || { printf '%s\n' "$out" | tail -5 >&2; die "$proxy: the relay client gave no result"; }
  local messages p50 p99 failed secs kv
  for kv in ${line#RESULT }; do
    case ${kv%%=*} in
      messages) messages=${kv#*=} ;; secs) secs=${kv#*=} ;; p50_us) p50=${kv#*=} ;;
      p99_us) p99=${kv#*=} ;; failed) failed=${kv#*=} ;;
    esac
  done
  ((failed == 0)) || echo "  WARNING: $proxy: $failed socket(s) failed mid-run"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$proxy" "$size" "$messages" "$secs" "$((t1 - t0))" "$p50" "$p99" >>"$results"
  printf '  %-9s %6s B  %8s round trips  %5s ticks  p50 %6s us  p99 %6s us\n' \
    "$proxy" "$size" "$messages" "$((t1 - t0))" "$p50" "$p99"
}

for ((r = 1; r <= ROUNDS; r++)); do
  echo "round $r"
  for size in $SIZES; do
    for ((k = 0; k < ${#proxies[@]}; k++)); do
      measure "${proxies[(k + r - 1) % ${#proxies[@]}]}" "$size"
    done
  done
done

python3 - "$results" <<'EOF'
import sys, statistics
rows = [l.split('\t') for l in open(sys.argv[1]).read().split('\n') if l]
by = {}
for proxy, size, msgs, secs, ticks, p50, p99 in rows:
    by.setdefault((int(size), proxy), []).append((int(msgs), float(secs), int(ticks), int(p50), int(p99)))
print(f"\n{'size':>6} {'proxy':10} {'trips/s':>9} {'ticks/1k':>9} {'p50 us':>7} {'p99 us':>7} {'CPU vs nginx':>12} {'p99 vs nginx':>12}   (medians)")
for size in sorted({s for s, _ in by}):
    med = {}
    for proxy in ['shardgate', 'nginx', 'haproxy']:
        runs = by.get((size, proxy), [])
        if not runs:
            continue
        med[proxy] = (
            statistics.median(m / s for m, s, _, _, _ in runs),
            statistics.median(1000 * t / max(m, 1) for m, _, t, _, _ in runs),
            statistics.median(p for _, _, _, p, _ in runs),
            statistics.median(p for _, _, _, _, p in runs),
        )
    ngx = med.get('nginx')
    for proxy, (rate, cpu, p50, p99) in med.items():
        vs = lambda a, b: f"{a / b:.2f}" if ngx and proxy != 'nginx' and b > 0 else "-"
        print(f"{size:6} {proxy:10} {rate:9.0f} {cpu:9.2f} {p50:7.0f} {p99:7.0f} "
              f"{vs(cpu, ngx[1] if ngx else 0):>12} {vs(p99, ngx[3] if ngx else 0):>12}")
print("\nticks/1k: the proxy's CPU clock ticks per 1 000 round trips (two relays each).")
EOF
