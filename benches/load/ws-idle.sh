#!/usr/bin/env bash
# Idle-WebSocket memory: K idle WebSockets held open through shardgate,
# nginx and HAProxy in turn; memory per connection from the proxy's RSS
# growth, and whether the memory comes back once the sockets close.
#
# A stdlib-only asyncio WebSocket backend (ws_idle.py server, 4 ports,
# core 1) accepts and holds the sockets; for each proxy (started fresh,
# pinned to core 0) the client (ws_idle.py client, core 1) opens and
# closes WARMUP sockets, reads the proxy's RSS, opens K WebSockets with
# `Host: tenant-<i>.localhost` (i over WS_HOSTS hosts), checks every 101,
# waits until the backend holds all K, idles IDLE s, reads the RSS, closes
# them all, waits until the backend holds none, reads the RSS, reads it
# once more SETTLE s later, and (REOPEN=1) opens K again to see whether
# memory kept after the close is reused. See benches/load/README.md.
#
#   bash benches/load/ws-idle.sh [--build]
#
# Environment (defaults):
#   SHARDGATE_BIN=target/release/shardgate   the gateway (relative: to the repo root)
#   BUILD=0          1 (or --build): cargo build --release --bin shardgate first
#   K=5000           idle WebSockets per proxy
#   WS_HOSTS=1000    tenant hosts the sockets rotate over
#   WARMUP=10        sockets opened and closed before the baseline (0: none)
#   IDLE=3           seconds the K sockets stay idle before the RSS is read
#   SETTLE=5         seconds after the close before the last RSS reading
#   REOPEN=1         0: skip opening K sockets a second time
#   ROUNDS=1         rounds (every proxy once per round; medians if > 1)
#   CONCURRENCY=100  upgrades in flight while opening
#   SOURCES=8        client source addresses 127.0.0.2.. (so K=50000 does not
#                    run out of ephemeral ports to one proxy port)
#   PROXIES="shardgate nginx haproxy"
#   KEEP=0           1: keep the temporary directory (configs, logs)
# Ports: backend 18201-18204 (control 18200), shardgate 18180 (admin
# 18190), nginx 18181, HAProxy 18182; all on 127.0.0.1.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
caller=$PWD
# shellcheck source=lib.sh
source "$here/lib.sh"

parse_args "$0" "$@"

K=${K:-5000}
WS_HOSTS=${WS_HOSTS:-1000}
WARMUP=${WARMUP:-10}
REOPEN=${REOPEN:-1}
IDLE=${IDLE:-3}
SETTLE=${SETTLE:-5}
ROUNDS=${ROUNDS:-1}
CONCURRENCY=${CONCURRENCY:-100}
SOURCES=${SOURCES:-8}
PROXIES=${PROXIES:-"shardgate nginx haproxy"}
for v in K WS_HOSTS ROUNDS CONCURRENCY; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
[[ $REOPEN == 0 || $REOPEN == 1 ]] || die "REOPEN must be 0 or 1"
for v in WARMUP IDLE SETTLE; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer (got '${!v}')"
done
for p in $PROXIES; do
  case $p in shardgate | nginx | haproxy) ;; *) die "unknown proxy '$p' in PROXIES" ;; esac
done
for t in nginx haproxy taskset curl ss pgrep python3; do
  command -v "$t" >/dev/null || die "$t is needed"
done
(($(nproc) >= 2)) || die "needs 2 cores (proxies on core 0, client and backend on core 1)"
if [[ " $PROXIES " == *" shardgate "* ]]; then
  resolve_shardgate_bin "$root" "$caller"
fi
cd "$root"

# Each proxied socket costs the proxy two descriptors.
need=$((2 * K + 2048))
if (($(ulimit -n) < need)); then
  ulimit -n "$need" 2>/dev/null || ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
fi
(($(ulimit -n) >= need)) ||
  die "ulimit -n is $(ulimit -n) (hard limit $(ulimit -Hn)): K=$K needs at least $need; lower K or raise the hard limit"

SG_PORT=18180 SG_ADMIN=18190 NGINX_PORT=18181 HAPROXY_PORT=18182 CONTROL=18200
backend_ports=(18201 18202 18203 18204)
check_ports_free "$SG_PORT" "$SG_ADMIN" "$NGINX_PORT" "$HAPROXY_PORT" "$CONTROL" "${backend_ports[@]}"
read -r -a proxies <<<"$PROXIES"

lib_init
results=$SG_WORK/ws.tsv
estimate=$((ROUNDS * ${#proxies[@]} * ((IDLE + K / 2000) * (1 + REOPEN) + SETTLE + 2)))
echo "idle WebSockets: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if [[ " $PROXIES " == *" shardgate "* ]]; then
  echo "  shardgate: $SHARDGATE_BIN ($("$SHARDGATE_BIN" --version 2>/dev/null || echo '?'))"
fi
echo "  K=$K sockets over $WS_HOSTS hosts per proxy, warm-up $WARMUP, idle ${IDLE} s, settle ${SETTLE} s, $ROUNDS round(s); ulimit -n $(ulimit -n)"
echo "  proxies on core 0; client and backend on core 1; estimated time: about $estimate s"
echo

spawn ws-backend TERM taskset -c 1 python3 "$here/ws_idle.py" server \
  --ports "$(IFS=,; echo "${backend_ports[*]}")" --control "$CONTROL"
backend_pid=$SPAWNED
for p in "${backend_ports[@]}" "$CONTROL"; do wait_tcp "$p" "$backend_pid" ws-backend; done

write_shardgate_conf "$SG_WORK/shardgate.yaml" "$SG_PORT" "$SG_ADMIN" "${backend_ports[@]}"
write_nginx_proxy_conf "$SG_WORK/nginx.conf" ws "$NGINX_PORT" $((K + 1024)) "${backend_ports[@]}"
write_haproxy_conf "$SG_WORK/haproxy.cfg" "$HAPROXY_PORT" $((K + 1024)) "${backend_ports[@]}"

printf 'round\tproxy\tcount\topened\tfailed\tstill_open\trss_before_kib\trss_open_kib\trss_closed_kib\trss_settled_kib\trss_reopen_kib\treopened\tpeak_rss_kib\tpss_before_kib\tpss_open_kib\tidle_cpu_ticks\tidle_s\n' >"$results"

probe() { # ROUND PROXY
  local round=$1 proxy=$2 port fam=() rc=0 line
  case $proxy in
    shardgate) port=$SG_PORT; start_proxy shardgate "$SG_WORK/shardgate.yaml" "$port" "$SG_ADMIN" ;;
    nginx) port=$NGINX_PORT; start_proxy nginx "$SG_WORK/nginx.conf" "$port" ;;
    haproxy) port=$HAPROXY_PORT; start_proxy haproxy "$SG_WORK/haproxy.cfg" "$port" ;;
  esac
  local pid=$SPAWNED
  read -r -a fam <<<"$(family "$pid")"
  local extra=()
  ((REOPEN)) || extra+=(--no-reopen)
  spawn ws-client TERM taskset -c 1 python3 "$here/ws_idle.py" client \
    --target "127.0.0.1:$port" --control "127.0.0.1:$CONTROL" --pids "${fam[*]}" \
    --count "$K" --hosts "$WS_HOSTS" --warmup "$WARMUP" --idle "$IDLE" --settle "$SETTLE" \
    --concurrency "$CONCURRENCY" --sources "$SOURCES" "${extra[@]}"
  local cpid=$SPAWNED
  wait "$cpid" || rc=$?
  stop "$cpid"
  if ! alive "$pid"; then
    log_tail "$proxy"
    die "$proxy (pid $pid) exited during the probe (log above)"
  fi
  local hwm
  hwm=$(status_kib VmHWM "${fam[@]}")
  stop "$pid"
  line=$(grep '^RESULT ' "$SG_WORK/ws-client.log" || true)
  if [[ -z $line ]]; then
    log_tail ws-client
    die "the WebSocket client gave no result for $proxy"
  fi
  local kv r_count r_opened r_failed r_still_open r_rss_before_kib r_rss_open_kib \
    r_rss_closed_kib r_rss_settled_kib r_open_s \
    r_rss_reopen_kib=0 r_reopened=0 r_fds_before r_fds_open r_fds_settled r_backend_left_after_close \
    r_pss_before_kib=0 r_pss_open_kib=0 r_idle_cpu_ticks=0 r_idle_s=0
  for kv in ${line#RESULT }; do
    case ${kv%%=*} in
      count | opened | failed | still_open | rss_before_kib | rss_open_kib | rss_closed_kib | \
        rss_settled_kib | open_s | rss_reopen_kib | reopened | \
        fds_before | fds_open | fds_settled | backend_left_after_close | \
        pss_before_kib | pss_open_kib | idle_cpu_ticks | idle_s)
        printf -v "r_${kv%%=*}" '%s' "${kv#*=}"
        ;;
    esac
  done
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$proxy" "$r_count" "$r_opened" \
    "$r_failed" "$r_still_open" "$r_rss_before_kib" "$r_rss_open_kib" "$r_rss_closed_kib" \
    "$r_rss_settled_kib" "$r_rss_reopen_kib" "$r_reopened" "$hwm" \
    "$r_pss_before_kib" "$r_pss_open_kib" "$r_idle_cpu_ticks" "$r_idle_s" >>"$results"
  awk -v r="$round" -v R="$ROUNDS" -v p="$proxy" -v k="$r_count" -v o="$r_opened" -v f="$r_failed" \
    -v s="$r_still_open" -v b="$r_rss_before_kib" -v op="$r_rss_open_kib" -v c="$r_rss_closed_kib" \
    -v st="$r_rss_settled_kib" -v ot="$r_open_s" -v settle="$SETTLE" -v ro="$r_rss_reopen_kib" \
    -v rn="$r_reopened" 'BEGIN {
      printf "round %d/%d  %-9s %d/%d upgraded in %.1f s (%d failed), %d open after idling;  RSS MiB: before %.1f, open %.1f, closed %.1f, +%d s %.1f",
        r, R, p, o, k, ot, f, s, b / 1024, op / 1024, c / 1024, settle, st / 1024
      if (rn > 0) printf ", reopened %.1f", ro / 1024
      printf ";  %.2f KiB/conn\n", (op - b) / (o > 0 ? o : 1)
    }'
  awk -v p="$r_pss_before_kib" -v q="$r_pss_open_kib" -v o="$r_opened" -v t="$r_idle_cpu_ticks" -v s="$r_idle_s" 'BEGIN {
      printf "           PSS: %.2f KiB/conn; CPU while idle: %d ticks in %.1f s\n", (q - p) / (o > 0 ? o : 1), t, s
    }'
  echo "           proxy descriptors: before $r_fds_before, open $r_fds_open, +${SETTLE} s $r_fds_settled;" \
    "upstream sockets still open at the backend after the close: $r_backend_left_after_close"
  if ((rc != 0)); then
    echo "  WARNING: $proxy: not every socket upgraded and stayed open (see above)"
    sed -n '/RESULT/!p' "$SG_WORK/ws-client.log" | head -n 5 | sed 's/^/  /'
  fi
}

for ((round = 1; round <= ROUNDS; round++)); do
  for ((k = 0; k < ${#proxies[@]}; k++)); do
    probe "$round" "${proxies[(k + round - 1) % ${#proxies[@]}]}"
  done
done

echo
python3 - "$results" "$SETTLE" <<'PY'
import csv
import statistics
import sys

rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
settle = sys.argv[2]
order = ["shardgate", "nginx", "haproxy"]
by = {}
for r in rows:
    r = {k: (v if k == "proxy" else int(v) if v.lstrip("-").isdigit() else float(v))
         for k, v in r.items()}
    n = max(r["opened"], 1)
    grown = r["rss_open_kib"] - r["rss_before_kib"]
    r["per_conn"] = grown / n
    r["pss_per_conn"] = (r["pss_open_kib"] - r["pss_before_kib"]) / n
    r["idle_ticks_per_s"] = r["idle_cpu_ticks"] / r["idle_s"] if r["idle_s"] else None
    r["returned"] = 100 * (r["rss_open_kib"] - r["rss_settled_kib"]) / grown if grown > 0 else None
    r["per_conn_reopen"] = ((r["rss_reopen_kib"] - r["rss_settled_kib"]) / r["reopened"]
                            if r["reopened"] else None)
    by.setdefault(r["proxy"], []).append(r)


def spread(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = fmt.format(statistics.median(values))
    return med if len(values) == 1 else f"{med} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def verdict(pct):
    if pct is None:
        return "-"
    word = "yes" if pct >= 90 else "partly" if pct >= 50 else "no"
    return f"{word} ({int(round(pct)) + 0} %)"


ngx = statistics.median([r["per_conn"] for r in by["nginx"]]) if "nginx" in by else None
head = ["proxy", "sockets", "RSS before", "RSS open", "KiB/conn", "vs nginx",
        "RSS closed", f"RSS +{settle} s", "memory returned", "KiB/conn reopen", "peak RSS",
        "PSS KiB/conn", "idle CPU ticks/s"]
table = [head]
for p in [p for p in order if p in by]:
    rs = by[p]
    col = lambda k: [r[k] for r in rs]
    per = statistics.median(col("per_conn"))
    table.append([
        p,
        f"{min(col('opened'))}/{rs[0]['count']}",
        spread([v / 1024 for v in col("rss_before_kib")], "{:.1f}"),
        spread([v / 1024 for v in col("rss_open_kib")], "{:.1f}"),
        spread(col("per_conn"), "{:.2f}"),
        "-" if p == "nginx" or not ngx else f"{per / ngx:.2f}",
        spread([v / 1024 for v in col("rss_closed_kib")], "{:.1f}"),
        spread([v / 1024 for v in col("rss_settled_kib")], "{:.1f}"),
        verdict(statistics.median([r["returned"] for r in rs]) if all(r["returned"] is not None for r in rs) else None),
        spread(col("per_conn_reopen"), "{:.2f}"),
        spread([v / 1024 for v in col("peak_rss_kib")], "{:.1f}"),
        spread(col("pss_per_conn"), "{:.2f}"),
        spread(col("idle_ticks_per_s"), "{:.2f}"),
    ])
widths = [max(len(row[i]) for row in table) for i in range(len(head))]
for row in table:
    print("  ".join(c.ljust(w) if i in (0, 8) else c.rjust(w)
                    for i, (c, w) in enumerate(zip(row, widths))).rstrip())
print(f"""
RSS in MiB (VmRSS, nginx: master + worker summed; peak: VmHWM). KiB/conn =
(RSS open - RSS before) / sockets opened; "vs nginx": over nginx's KiB/conn.
Memory returned = (RSS open - RSS +{settle} s) / (RSS open - RSS before):
yes >= 90 %, partly >= 50 %, no < 50 %. KiB/conn reopen = (RSS with K open
a second time - RSS +{settle} s) / K: near 0 = memory kept after the close is
reused, near KiB/conn = it is not. PSS KiB/conn: the same from PSS
(smaps_rollup; shared pages split). Idle CPU: the proxy's clock ticks per
second while the K sockets sit idle.""")
PY
