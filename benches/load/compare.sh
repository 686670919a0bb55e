#!/usr/bin/env bash
# shardgate vs nginx vs HAProxy vs the direct path, with wrk.
#
# Starts 4 identical nginx backends (one nginx, one worker, `200 ok\n`),
# then, interleaved over ROUNDS rounds (each round runs every proxy once per
# case, in an order rotated from round to round), for each case (request
# shape × 32 and 256 keep-alive connections × 1 host and 1 000 rotating
# tenant hosts; shapes: GET, POST with a 1 KiB JSON body, POST of 1 MiB):
# shardgate, nginx as a proxy (`hash $host consistent`, upstream
# keep-alive), HAProxy (`balance hdr(host)`, `hash-type consistent`,
# `http-reuse always`) and wrk straight at one backend. Each proxy is
# started fresh for every run, pinned to core 0; wrk and the backends run
# on core 1. Prints medians (min-max) of requests/s, p50/p99 latency, the
# proxy's CPU per 1 000 requests, its peak RSS, the upstream connections it
# opened, and the ratios to nginx. See benches/load/README.md.
#
#   bash benches/load/compare.sh [--build]
#
# Environment (defaults):
#   SHARDGATE_BIN=target/release/shardgate   the gateway (relative: to the repo root)
#   BUILD=0           1 (or --build): cargo build --release --bin shardgate first
#   ROUNDS=3          rounds (every proxy × case once per round)
#   SECS=10           seconds per wrk run
#   CONNS="32 256"    wrk connection counts
#   HOSTS_LIST="1 1000"  tenant host counts (hosts.lua's HOSTS)
#   SHAPES="get post" request shapes, any of: get = `GET /` (report.lua);
#                     post = `POST /` with a 1 KiB JSON body (post.lua);
#                     upload = `POST /upload` with a 1 MiB body (upload.lua)
#   PROXIES="shardgate nginx haproxy direct"  (also: pingora = a bare Pingora
#                     proxy, examples/bare_pingora.rs; sg-nofast = shardgate
#                     with `server.fast_path: false`, every request on
#                     Pingora's path; shardgate2 = a second shardgate
#                     binary, SHARDGATE2_BIN, for A/B comparisons)
#   PINGORA_BIN=target/release/examples/bare_pingora
#   SHARDGATE2_BIN=   the other shardgate for `shardgate2`
#   SG2_LOG=          `shardgate2`'s own `log:` value, e.g.
#                     '{ access_format: json, access_path: "{dir}/access.log" }'
#                     (default: `shardgate`'s, `{ access: off }`)
#   SG2_SERVER_EXTRA= more `server:` fields for `shardgate2`, e.g.
#                     'work_stealing: false' (a current-thread runtime per
#                     thread, as nginx's worker per core)
#   SG2_EXTRA=        more top-level lines for `shardgate2`, e.g.
#                     'tracing: { otlp_endpoint: "http://127.0.0.1:18101", sample_ratio: 0.01 }'
#                     (a backend port answers the OTLP POSTs 200)
#   BACKENDS=4        backend ports (18101…)
#   HAPROXY_MAXCONN=  HAProxy's maxconn (default 16 x the most connections, >= 4096)
#   OUT=              also write the raw per-run rows (TSV) to this file
#   KEEP=0            1: keep the temporary directory (configs, logs)
# Ports: backends 18101-181NN, shardgate 18080 (admin 18090), nginx 18081,
# HAProxy 18082; all on 127.0.0.1.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
caller=$PWD
# shellcheck source=lib.sh
source "$here/lib.sh"

parse_args "$0" "$@"

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-10}
CONNS=${CONNS:-"32 256"}
HOSTS_LIST=${HOSTS_LIST:-"1 1000"}
SHAPES=${SHAPES:-"get post"}
PROXIES=${PROXIES:-"shardgate nginx haproxy direct"}
BACKENDS=${BACKENDS:-4}
OUT=${OUT:-}

for v in ROUNDS SECS BACKENDS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
((BACKENDS <= 98)) || die "BACKENDS must be at most 98"
for c in $CONNS $HOSTS_LIST; do
  [[ $c =~ ^[1-9][0-9]*$ ]] || die "CONNS and HOSTS_LIST must hold positive integers (got '$c')"
done
for s in $SHAPES; do
  case $s in get | post | upload) ;; *) die "unknown shape '$s' in SHAPES (get, post, upload)" ;; esac
done
[[ -n ${SHAPES// /} ]] || die "SHAPES is empty"
for p in $PROXIES; do
  case $p in shardgate | sg-nofast | shardgate2 | pingora | nginx | haproxy | direct) ;; *) die "unknown proxy '$p' in PROXIES" ;; esac
done
for t in wrk nginx haproxy taskset curl ss pgrep python3; do
  command -v "$t" >/dev/null || die "$t is needed (Debian: apt-get install wrk nginx-light haproxy curl iproute2 procps python3)"
done
(($(nproc) >= 2)) || die "needs 2 cores (proxies on core 0, wrk and backends on core 1)"
if [[ " $PROXIES " == *" shardgate "* || " $PROXIES " == *" sg-nofast "* ]]; then
  resolve_shardgate_bin "$root" "$caller"
fi
if [[ " $PROXIES " == *" pingora "* ]]; then
  PINGORA_BIN=${PINGORA_BIN:-$root/target/release/examples/bare_pingora}
  [[ -x $PINGORA_BIN ]] || die "no bare Pingora proxy at $PINGORA_BIN: cargo build --release --example bare_pingora"
fi
if [[ " $PROXIES " == *" shardgate2 "* ]]; then
  [[ -x ${SHARDGATE2_BIN:-} ]] || die "shardgate2 needs SHARDGATE2_BIN (another shardgate binary)"
fi
cd "$root"

SG_PORT=18080 SG_ADMIN=18090 NGINX_PORT=18081 HAPROXY_PORT=18082 PINGORA_PORT=18083
backend_ports=()
for ((i = 1; i <= BACKENDS; i++)); do backend_ports+=($((18100 + i))); done
check_ports_free "$SG_PORT" "$SG_ADMIN" "$NGINX_PORT" "$HAPROXY_PORT" "$PINGORA_PORT" "${backend_ports[@]}"
maxconns=0
for c in $CONNS; do ((c > maxconns)) && maxconns=$c; done
(($(ulimit -n) >= 2 * maxconns + 256)) || ulimit -n $((2 * maxconns + 256)) 2>/dev/null ||
  die "ulimit -n is $(ulimit -n): too low for $maxconns connections"

# HAProxy stops keeping idle upstream connections once the descriptors in
# use pass 20-25 % of what maxconn allows (tune.pool-low/high-fd-ratio): a
# maxconn close to the load makes it close and reopen upstream connections
# all the time. 16 x the connections (at least 4 096), within the fd limit.
hard=$(ulimit -Hn)
[[ $hard == unlimited ]] && hard=1048576
haproxy_maxconn=${HAPROXY_MAXCONN:-$((16 * maxconns > 4096 ? 16 * maxconns : 4096))}
((2 * haproxy_maxconn + 512 <= hard)) || haproxy_maxconn=$(((hard - 512) / 2))

read -r -a proxies <<<"$PROXIES"
read -r -a conns_list <<<"$CONNS"
read -r -a hosts_list <<<"$HOSTS_LIST"
read -r -a shapes <<<"$SHAPES"
runs=$((ROUNDS * ${#shapes[@]} * ${#conns_list[@]} * ${#hosts_list[@]} * ${#proxies[@]}))
estimate=$((runs * (SECS + 1) + 5))
hz=$(getconf CLK_TCK)

lib_init
results=$SG_WORK/results.tsv
printf 'round\tproxy\tshape\tconns\thosts\trequests\tduration_us\tp50_us\tp99_us\tcpu_ticks\tclk_tck\tpeak_rss_kib\tnew_upstream_conns\terrors\tcore0_busy_pct\tcore1_busy_pct\tuser_ticks\n' >"$results"

echo "shardgate load comparison: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if [[ " $PROXIES " == *" shardgate "* ]]; then
  echo "  shardgate: $SHARDGATE_BIN ($("$SHARDGATE_BIN" --version 2>/dev/null || echo '?'))"
fi
echo "  $(nginx -v 2>&1), $(haproxy -v 2>/dev/null | head -n 1 | cut -d' ' -f1-3), $(wrk --version 2>&1 | head -n 1 | cut -d' ' -f1-2)"
echo "  proxies on core 0; wrk (1 thread, HTTP/1.1 keep-alive) and $BACKENDS backends on core 1"
echo "  $ROUNDS rounds x ${#shapes[@]} shapes ($SHAPES) x ${#conns_list[@]} conn counts x ${#hosts_list[@]} host counts x ${#proxies[@]} targets = $runs runs of ${SECS} s"
printf '  estimated time: about %d min %02d s (load average now: %s)\n' $((estimate / 60)) $((estimate % 60)) "$(cut -d' ' -f1-3 /proc/loadavg)"
echo

# The backends: one nginx, one worker, every port; it logs one line per new
# connection (see write_backend_conf).
write_backend_conf "$SG_WORK/backend.conf" "${backend_ports[@]}"
spawn backend TERM taskset -c 1 nginx -p "$SG_WORK/" -c "$SG_WORK/backend.conf" -e "$SG_WORK/backend-error.log"
backend_pid=$SPAWNED
for p in "${backend_ports[@]}"; do wait_tcp "$p" "$backend_pid" backend; done
conns_log=$SG_WORK/backend-conns.log
touch "$conns_log"

write_shardgate_conf "$SG_WORK/shardgate.yaml" "$SG_PORT" "$SG_ADMIN" "${backend_ports[@]}"
SG_LOG=${SG2_LOG:-${SG_LOG:-}} SG_EXTRA=${SG2_EXTRA:-${SG_EXTRA:-}} \
  SG_SERVER_EXTRA=${SG2_SERVER_EXTRA:-${SG_SERVER_EXTRA:-}} write_shardgate_conf "$SG_WORK/sg2.yaml" "$SG_PORT" "$SG_ADMIN" "${backend_ports[@]}"
SG_SERVER_EXTRA="fast_path: false${SG_SERVER_EXTRA:+, $SG_SERVER_EXTRA}" \
  write_shardgate_conf "$SG_WORK/sg-nofast.yaml" "$SG_PORT" "$SG_ADMIN" "${backend_ports[@]}"
write_nginx_proxy_conf "$SG_WORK/nginx.conf" http "$NGINX_PORT" $((maxconns + 1024)) "${backend_ports[@]}"
write_haproxy_conf "$SG_WORK/haproxy.cfg" "$HAPROXY_PORT" "$haproxy_maxconn" "${backend_ports[@]}"

# new_conns FROM_BYTE: distinct backend connections logged since FROM_BYTE.
new_conns() {
  tail -c +$(($1 + 1)) "$conns_log" | awk '{ seen[$1] = 1 } END { print length(seen) }'
}

# shape_script SHAPE: the wrk script of a request shape.
shape_script() {
  case $1 in
    get) echo "$here/report.lua" ;;
    post) echo "$here/post.lua" ;;
    upload) echo "$here/upload.lua" ;;
  esac
}

# run ROUND PROXY SHAPE CONNS HOSTS: one wrk run; appends a row to $results
# and prints a progress line.
run() {
  local round=$1 proxy=$2 shape=$3 conns=$4 hosts=$5
  local port pid="" fam=() from t0=0 t1=0 u0=0 s0=0 u1=0 s1=0 hwm=0 line c0 c1
  from=$(stat -c %s "$conns_log")
  case $proxy in
    shardgate)
      port=$SG_PORT
      start_proxy shardgate "$SG_WORK/shardgate.yaml" "$port" "$SG_ADMIN"
      ;;
    sg-nofast)
      port=$SG_PORT
      start_proxy shardgate "$SG_WORK/sg-nofast.yaml" "$port" "$SG_ADMIN"
      ;;
    shardgate2)
      port=$SG_PORT
      SHARDGATE_BIN=$SHARDGATE2_BIN start_proxy shardgate "$SG_WORK/sg2.yaml" "$port" "$SG_ADMIN"
      ;;
    pingora)
      port=$PINGORA_PORT
      spawn pingora INT taskset -c 0 "$PINGORA_BIN" "127.0.0.1:$port" 1 "${backend_ports[@]/#/127.0.0.1:}"
      wait_tcp "$port" "$SPAWNED" pingora
      ;;
    nginx)
      port=$NGINX_PORT
      start_proxy nginx "$SG_WORK/nginx.conf" "$port"
      ;;
    haproxy)
      port=$HAPROXY_PORT
      start_proxy haproxy "$SG_WORK/haproxy.cfg" "$port"
      ;;
    direct) port=${backend_ports[0]} ;;
  esac
  if [[ $proxy != direct ]]; then
    pid=$SPAWNED
    read -r -a fam <<<"$(family "$pid")"
    read -r u0 s0 <<<"$(cpu_ticks_split "${fam[@]}")"
    t0=$((u0 + s0))
  fi
  read -r -a c0 <<<"$(core_times)"
  spawn wrk INT env HOSTS="$hosts" taskset -c 1 wrk -t1 -c"$conns" -d"${SECS}s" --timeout 5s \
    -s "$(shape_script "$shape")" "http://127.0.0.1:$port/"
  local wrk_pid=$SPAWNED
  wait "$wrk_pid" || true
  read -r -a c1 <<<"$(core_times)"
  stop "$wrk_pid"
  if [[ $proxy != direct ]]; then
    if ! alive "$pid"; then
      log_tail "$proxy"
      die "$proxy (pid $pid) exited during the run ($shape, $conns conns, $hosts hosts; log above)"
    fi
    read -r u1 s1 <<<"$(cpu_ticks_split "${fam[@]}")"
    t1=$((u1 + s1))
    hwm=$(status_kib VmHWM "${fam[@]}")
    stop "$pid"
  fi
  line=$(grep '^WRK_RESULT ' "$SG_WORK/wrk.log" || true)
  if [[ -z $line ]]; then
    log_tail wrk
    die "wrk gave no result for $proxy ($shape, $conns conns, $hosts hosts)"
  fi
  # WRK_RESULT key=value … → variables w_requests, w_duration_us, …
  local kv w_requests w_duration_us w_p50_us w_p99_us w_connect w_read w_write w_status w_timeout
  for kv in ${line#WRK_RESULT }; do
    case ${kv%%=*} in
      requests | duration_us | p50_us | p99_us | connect | read | write | status | timeout)
        printf -v "w_${kv%%=*}" '%s' "${kv#*=}"
        ;;
    esac
  done
  local errors=$((w_connect + w_read + w_write + w_status + w_timeout))
  local newc busy0 busy1
  newc=$(new_conns "$from")
  busy0=$((100 * (c1[0] - c0[0]) / (c1[1] - c0[1] > 0 ? c1[1] - c0[1] : 1)))
  busy1=$((100 * (c1[2] - c0[2]) / (c1[3] - c0[3] > 0 ? c1[3] - c0[3] : 1)))
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$proxy" "$shape" "$conns" "$hosts" \
    "$w_requests" "$w_duration_us" "$w_p50_us" "$w_p99_us" $((t1 - t0)) "$hz" "$hwm" "$newc" "$errors" \
    "$busy0" "$busy1" $((u1 - u0)) >>"$results"
  awk -v r="$round" -v R="$ROUNDS" -v p="$proxy" -v sh="$shape" -v c="$conns" -v h="$hosts" -v n="$w_requests" \
    -v d="$w_duration_us" -v p50="$w_p50_us" -v p99="$w_p99_us" -v t=$((t1 - t0)) -v hz="$hz" \
    -v rss="$hwm" -v nc="$newc" -v e="$errors" -v b0="$busy0" -v b1="$busy1" 'BEGIN {
      s = d / 1e6; cpu = "-"; mem = "-"
      if (p != "direct") {
        cpu = sprintf("%6.2f ms/1k req (%3.0f%% of a core)", t / hz * 1000 / (n / 1000), t / hz / s * 100)
        mem = sprintf("%6.1f MiB", rss / 1024)
      }
      printf "round %d/%d  %-6s %3d conns %4d hosts  %-10s %8.0f req/s  p50 %6.2f ms  p99 %6.2f ms  CPU %-32s  peak RSS %-10s  new upstream conns %5d  errors %d  cores busy %3d%% %3d%%\n",
        r, R, sh, c, h, p, n / s, p50 / 1000, p99 / 1000, cpu, mem, nc, e, b0, b1
    }'
}

for ((round = 1; round <= ROUNDS; round++)); do
  for shape in "${shapes[@]}"; do
    for conns in "${conns_list[@]}"; do
      for hosts in "${hosts_list[@]}"; do
        for ((k = 0; k < ${#proxies[@]}; k++)); do
          run "$round" "${proxies[(k + round - 1) % ${#proxies[@]}]}" "$shape" "$conns" "$hosts"
        done
      done
    done
  done
done

[[ -z $OUT ]] || cp "$results" "$OUT"
echo
python3 - "$results" "$ROUNDS" "$SECS" "$SHAPES" "$here" <<'PY'
import csv
import statistics
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the repository
sys.path.insert(0, sys.argv[5])
from paired import lower_ratios, median_ci, spread

path, rounds, secs, shapes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
rows = list(csv.DictReader(open(path), delimiter="\t"))
order = ["shardgate", "sg-nofast", "shardgate2", "pingora", "nginx", "haproxy", "direct"]
runs = {}  # (proxy, shape, conns, hosts) -> {round: metrics}
for r in rows:
    n = int(r["requests"])
    s = int(r["duration_us"]) / 1e6
    ticks, hz = int(r["cpu_ticks"]), int(r["clk_tck"])
    direct = r["proxy"] == "direct"
    m = {
        "rps": n / s,
        "p50": int(r["p50_us"]) / 1000,
        "p99": int(r["p99_us"]) / 1000,
        "cpu": None if direct or n == 0 else ticks / hz * 1000 / (n / 1000),
        "user": None if direct or n == 0 else int(r.get("user_ticks") or 0) / hz * 1000 / (n / 1000),
        "core": None if direct else ticks / hz / s * 100,
        "others": int(r["core0_busy_pct"]) - (0 if direct else ticks / hz / s * 100),
        "rss": None if direct else int(r["peak_rss_kib"]) / 1024,
        "conns": int(r["new_upstream_conns"]),
        "errors": int(r["errors"]),
    }
    key = (r["proxy"], r["shape"], int(r["conns"]), int(r["hosts"]))
    runs.setdefault(key, {})[int(r["round"])] = m


def user_sys(ms):
    """The medians of user and of system CPU per 1 000 requests."""
    user = [m["user"] for m in ms if m["user"] is not None]
    sys_ = [m["cpu"] - m["user"] for m in ms if m["user"] is not None]
    if not user:
        return "-"
    return f"{statistics.median(user):.2f}+{statistics.median(sys_):.2f}"


# Cases in SHAPES order, then by connections and hosts.
cases = sorted({(s, c, h) for (_, s, c, h) in runs}, key=lambda k: (shapes.index(k[0]), k[1], k[2]))
proxies = [p for p in order if any(k[0] == p for k in runs)]
head = ["proxy", "req/s", "p50 ms", "p99 ms", "CPU ms/1k req", "user+sys", "core %", "others %",
        "peak RSS MiB", "new upstr. conns", "req/s / nginx", "CPU / nginx",
        "CPU / lower of nginx, HAProxy [95% CI]", "errors"]
print(f"Medians over {rounds} round(s) of {secs} s, (min-max) where more than one;"
      " ratios: median of the per-round ratios to the same round's nginx run.")
any_errors = False
for shape, conns, hosts in cases:
    print(f"\n== {shape}, {conns} connections, {hosts} host{'s' if hosts != 1 else ''} ==")
    table = [head]
    ngx = runs.get(("nginx", shape, conns, hosts), {})
    for p in proxies:
        rs = runs.get((p, shape, conns, hosts))
        if not rs:
            continue
        ms = list(rs.values())
        col = lambda k: [m[k] for m in ms]
        rps_ratio = [m["rps"] / ngx[r]["rps"] for r, m in rs.items() if r in ngx]
        cpu_ratio = [m["cpu"] / ngx[r]["cpu"] for r, m in rs.items()
                     if r in ngx and m["cpu"] is not None and ngx[r]["cpu"]]
        hap = runs.get(("haproxy", shape, conns, hosts), {})
        cpus = lambda ms: {r: m["cpu"] for r, m in ms.items()}
        lower_ratio = lower_ratios(cpus(rs), cpus(ngx), cpus(hap))
        errors = sum(col("errors"))
        any_errors |= errors > 0
        table.append([
            p,
            spread(col("rps"), "{:.0f}"),
            spread(col("p50"), "{:.2f}"),
            spread(col("p99"), "{:.2f}"),
            spread(col("cpu"), "{:.2f}"),
            user_sys(ms),
            spread(col("core"), "{:.0f}"),
            spread([max(v, 0) for v in col("others")], "{:.0f}"),
            spread(col("rss"), "{:.1f}"),
            spread(col("conns"), "{:.0f}"),
            "-" if p == "nginx" else spread(rps_ratio, "{:.2f}"),
            "-" if p == "nginx" else spread(cpu_ratio, "{:.2f}"),
            "-" if p in ("nginx", "haproxy") else median_ci(lower_ratio, "{:.2f}"),
            str(errors),
        ])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))).rstrip())
print("""
req/s: completed requests / wrk's run time.  p50/p99: wrk's latency percentiles.
CPU ms/1k req: the proxy's utime+stime during the run (all threads; nginx:
  master + worker) per 1 000 requests; user+sys: its medians split into
  user and system (kernel) time.  core %: that CPU time / run time.
others %: core 0 busy with anything but the proxy (/proc/stat): noise.
peak RSS: VmHWM at the end of the run (nginx: master + worker summed); every
  run starts a fresh proxy.
new upstr. conns: connections the backends accepted during the run, counted
  by the backend's log of first requests (direct: wrk's own connections).
req/s / nginx, CPU / nginx: >1 = more throughput / more CPU per request than
  nginx.  CPU / lower of nginx, HAProxy: each round's CPU per request over
  the lower of that round's nginx and HAProxy runs; the median, and in
  brackets an interval holding the true median with at least 95 %
  (distribution-free; from 6 rounds: ROUNDS=7 gives min-max, 98.4 %).
  direct: wrk straight at one backend (the ceiling of core 1).
Per-run lines above also show how busy cores 0 and 1 were (all processes).
Shapes: get = GET /; post = POST / with a 1 KiB JSON body; upload = POST
  /upload with a 1 MiB body (req/s = MiB/s of request body).""")
if any_errors:
    print("\nWARNING: some runs had errors (socket errors or non-2xx responses):"
          " their numbers are not comparable.")
PY
