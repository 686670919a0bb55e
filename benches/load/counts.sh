#!/usr/bin/env bash
# Counts per request, shardgate against nginx and HAProxy on the same
# backend: what the machine's noise cannot move (user-space instructions:
# kernel time is not in them, and under valgrind or strace a proxy with
# many requests in flight batches its system calls otherwise than at full
# speed).
#   - instructions (callgrind), and heap allocations (calls into the
#     allocator: mimalloc's for shardgate, glibc's for nginx and HAProxy),
#     counted over N requests after W warm-up ones (`callgrind_control -z`
#     between them, so start-up and warm-up are not in the count);
#   - system calls (`strace -c -f` on every thread, attached after the
#     warm-up, the proxy running natively), with the calls that failed
#     (EAGAIN) shown apart;
#   - with ALLOC_BIN set, shardgate's allocations and bytes allocated per
#     request as its counting allocator reports them (a build with
#     `--features alloc-counts`: metrics shardgate_heap_*_total).
# Hardware counters (`perf stat` cycles, IPC, cache misses) are not
# collected: the script only says whether the machine has them (the VM it
# was written on has none: "not supported").
#
#   bash benches/load/counts.sh [--build]
#   SHAPES="get grpc" PROXIES="shardgate nginx" bash benches/load/counts.sh
#
# Shapes (SHAPES, default "get post h2get grpc"):
#   get    HTTP/1.1 keep-alive GETs (h2load --h1), C connections
#   post   the same with a 1 KiB body
#   h2get  HTTP/2 GETs with prior knowledge (h2c), C connections, 4 streams
#          in flight on each
#   grpc   gRPC unary over h2c on 1 connection, 32 calls in flight, to an
#          HTTP/2 backend (examples/grpc_echo.rs; `protocol: h2` shard,
#          nginx grpc_pass, HAProxy proto h2: benches/load/grpc.sh's setup)
#   h1grpc the same calls from HTTP/1.1 clients (h2load --h1, C
#          connections) to that HTTP/2 backend (grpc.sh's CLIENT=h1;
#          nginx cannot: grpc_pass takes HTTP/2 clients only, and is
#          skipped). HAProxy's HTTP/1.1 status line of a 200 is given a
#          reason phrase (`http-response set-status 200 reason OK if {
#          status 200 }`), which h2load --h1 requires.
# Features (FEATURES, default none; e.g. FEATURES="base plans-unused plans
# tracing-unsampled tracing compression access-log"): shardgate's GETs
# counted again with each feature configured alone (base: none of them),
# each against base, to show what a feature costs when it is not
# configured (base, with the instructions in its own functions), when it
# is configured but does not apply to the request, and when it does:
#   plans-unused       a plan defined, the tenant on none
#   plans              every tenant on that plan (default_plan)
#   tracing-unsampled  an OTLP collector (the backend), sample_ratio 0
#   tracing            the same, every request traced and exported
#   compression        compression on; the request asks for none (no
#                      Accept-Encoding) and the body is 3 bytes
#   access-log         a JSON access line per request to a file
# Environment (defaults): N=2000 requests counted, W=500 warm-up, C=8
# connections (get, post), PROXIES="shardgate nginx haproxy",
# SHARDGATE_BIN=target/release/shardgate, ECHO_BIN (grpc.sh's),
# TOP=0 (print each callgrind dump's TOP functions by own instructions),
# SYSCALLS=1 (0: skip the strace runs).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CALLER=$PWD
# shellcheck source=benches/load/lib.sh
source "$HERE/lib.sh"
parse_args "$0" "$@"
N=${N:-2000} W=${W:-500} C=${C:-8}
SHAPES=${SHAPES:-"get post h2get grpc"}
PROXIES=${PROXIES:-"shardgate nginx haproxy"}
TOP=${TOP:-0} SYSCALLS=${SYSCALLS:-1} FEATURES=${FEATURES:-}
ECHO_BIN=${ECHO_BIN:-$ROOT/target/release/examples/grpc_echo}
if [[ ${BUILD:-0} == 1 ]]; then
  (cd "$ROOT" && cargo build --release --example grpc_echo)
fi
resolve_shardgate_bin "$ROOT" "$CALLER"
for tool in valgrind callgrind_control strace h2load; do
  command -v $tool >/dev/null || die "$tool is missing (apt-get install valgrind strace nghttp2-client)"
done
lib_init

BACKEND=18301 GRPC_BACKEND=18302 PORT=18380 ADMIN=18381
check_ports_free $BACKEND $GRPC_BACKEND $PORT $ADMIN
write_backend_conf "$SG_WORK/backend.conf" $BACKEND
spawn backend TERM nginx -p "$SG_WORK/" -c "$SG_WORK/backend.conf" -e "$SG_WORK/backend-error.log"
wait_tcp $BACKEND "$SPAWNED" backend
if [[ " $SHAPES " == *" grpc "* || " $SHAPES " == *" h1grpc "* ]]; then
  [[ -x $ECHO_BIN ]] || die "no gRPC backend at $ECHO_BIN (cargo build --release --example grpc_echo, or --build)"
  spawn grpc-backend TERM "$ECHO_BIN" 127.0.0.1:$GRPC_BACKEND 1
  wait_tcp $GRPC_BACKEND "$SPAWNED" grpc-backend
fi
head -c 1024 /dev/zero | tr '\0' 'x' >"$SG_WORK/post.bin"
printf '\x00\x00\x00\x00\x10%s' 0123456789abcdef >"$SG_WORK/call.bin"

# The configurations of one shape, in their own folder (so the HTTP/1.1 and
# gRPC setups keep their file names); prints the folder.
confs_of() {
  local dir=$SG_WORK/$1
  mkdir -p "$dir"
  case $1 in
    grpc) write_grpc_confs "$dir" $PORT $ADMIN $GRPC_BACKEND h2 ;;
    h1grpc)
      write_grpc_confs "$dir" $PORT $ADMIN $GRPC_BACKEND h1
      sed -i 's/^    http-reuse always$/&\n    http-response set-status 200 reason OK if { status 200 }/' "$dir/haproxy.cfg"
      ;;
    *)
      write_shardgate_conf "$dir/shardgate.yaml" $PORT $ADMIN $BACKEND
      write_nginx_proxy_conf "$dir/nginx.conf" http $PORT 1024 $BACKEND
      write_haproxy_conf "$dir/haproxy.cfg" $PORT 4096 $BACKEND
      ;;
  esac
  if [[ $1 == h2get ]]; then
    # HTTP/2 with prior knowledge on the plain listener (shardgate takes it
    # there as it is).
    sed -i "s/listen 127.0.0.1:$PORT default_server/listen 127.0.0.1:$PORT http2 default_server/" "$dir/nginx.conf"
    sed -i "s/^    bind 127.0.0.1:$PORT\$/    bind 127.0.0.1:$PORT proto h2/" "$dir/haproxy.cfg"
  fi
  # One nginx process under valgrind: its counts are the worker's own.
  sed -i 's/^master_process on;/master_process off;/' "$dir/nginx.conf"
  echo "$dir"
}

# feature_conf NAME: shardgate's configuration with feature NAME (see
# FEATURES) in its own folder; prints the folder.
feature_conf() {
  local name=$1 dir=$SG_WORK/feature-$1 extra="" log=""
  local plan="plans: { gold: { connection_cap: 100000 } }"
  local collector="otlp_endpoint: \"http://127.0.0.1:$BACKEND\""
  case $name in
    base) ;;
    plans-unused) extra=$plan ;;
    plans) extra="$plan"$'\n'"default_plan: gold" ;;
    tracing-unsampled) extra="tracing: { $collector, sample_ratio: 0 }" ;;
    tracing) extra="tracing: { $collector, sample_ratio: 1 }" ;;
    compression) extra="compression: { min_bytes: 1024 }" ;;
    access-log) log='{ access: info, access_format: json, access_path: "{dir}/access.log" }' ;;
    *) die "unknown feature '$name' in FEATURES (base plans-unused plans tracing-unsampled tracing compression access-log)" ;;
  esac
  mkdir -p "$dir"
  SG_EXTRA=$extra SG_LOG=$log write_shardgate_conf "$dir/shardgate.yaml" $PORT $ADMIN $BACKEND
  echo "$dir"
}

# One tenant's host (h2load sends it as Host).
HOST=":authority: tenant-1.localhost"

# load SHAPE COUNT: sends COUNT requests of SHAPE; fails unless all got 2xx.
load() {
  local shape=$1 n=$2 out ok
  case $shape in
    get) out=$(h2load --h1 -n "$n" -c "$C" -H "$HOST" "http://localhost:$PORT/" 2>&1) ;;
    post) out=$(h2load --h1 -n "$n" -c "$C" -H "$HOST" -d "$SG_WORK/post.bin" "http://localhost:$PORT/" 2>&1) ;;
    h2get) out=$(h2load -n "$n" -c "$C" -m 4 -H "$HOST" "http://localhost:$PORT/" 2>&1) ;;
    grpc)
      out=$(h2load -n "$n" -c 1 -m 32 -d "$SG_WORK/call.bin" -H 'content-type: application/grpc' \
        -H 'te: trailers' "http://localhost:$PORT/test.Echo/Unary" 2>&1)
      ;;
    h1grpc)
      out=$(h2load --h1 -n "$n" -c "$C" -d "$SG_WORK/call.bin" -H 'content-type: application/grpc' \
        -H 'te: trailers' "http://localhost:$PORT/test.Echo/Unary" 2>&1)
      ;;
    *) die "unknown shape $shape" ;;
  esac
  ok=$(awk '/^status codes:/ { print $3 }' <<<"$out")
  [[ ${ok:-0} -eq $n ]] || { printf '%s\n' "$out" >&2; die "$shape: ${ok:-0} of $n requests got 2xx"; }
}

# run_proxy PROXY DIR [PREFIX...]: starts PROXY with DIR's configuration,
# under PREFIX (valgrind); waits up to 300 s for its listener.
run_proxy() {
  local proxy=$1 dir=$2
  shift 2
  case $proxy in
    shardgate) spawn shardgate INT env RUST_LOG=error "$@" "$SHARDGATE_BIN" -c "$dir/shardgate.yaml" ;;
    nginx) spawn nginx TERM "$@" nginx -p "$dir/" -c "$dir/nginx.conf" -e "$dir/nginx-error.log" ;;
    haproxy) spawn haproxy TERM "$@" haproxy -db -f "$dir/haproxy.cfg" ;;
    *) die "unknown proxy $proxy" ;;
  esac
  wait_tcp $PORT "$SPAWNED" "$proxy" 300
}

per() { awk -v a="$1" -v n="$2" 'BEGIN { printf "%.1f", a / n }'; }

declare -A ROWS=()
# callgrind_counts PROXY SHAPE DIR [FEATURE]: instructions and allocations
# per request (in ROWS under "PROXY SHAPE", or "FEATURE" when given).
callgrind_counts() {
  local proxy=$1 shape=$2 dir=$3 out=$SG_WORK/cg.$1.$2${4:+.$4} f instr=0 allocs=0 counts
  run_proxy "$proxy" "$dir" valgrind --tool=callgrind --dump-instr=no \
    --callgrind-out-file="$out.%p"
  local pid=$SPAWNED
  load "$shape" "$W"
  callgrind_control -z "$pid" >/dev/null
  load "$shape" "$N"
  callgrind_control -d "$pid" >/dev/null
  stop "$pid"
  for f in "$out".*.1; do
    [[ -e $f ]] || die "$proxy: no callgrind dump"
    counts=$(python3 "$HERE/callgrind_counts.py" "$f" --top "$TOP")
    instr=$((instr + $(awk '$1 == "instructions" { print $2 }' <<<"$counts")))
    allocs=$((allocs + $(awk '$1 == "allocations" { print $2 }' <<<"$counts")))
    ((TOP == 0)) || printf '%s %s, top functions (own instructions over %s requests):\n%s\n' \
      "$proxy" "$shape" "$N" "$(tail -n +3 <<<"$counts")"
  done
  ROWS["${4:-$proxy $shape}"]="$(per $instr "$N") $(per $allocs "$N")"
}

# syscall_counts PROXY SHAPE DIR: system calls per request, and those of
# them that failed.
syscall_counts() {
  local proxy=$1 shape=$2 dir=$3 pid tids=() t strace_pid calls errors
  run_proxy "$proxy" "$dir"
  pid=$SPAWNED
  load "$shape" "$W"
  for t in /proc/"$pid"/task/*; do tids+=(-p "${t##*/}"); done
  strace -c -f -o "$SG_WORK/strace.$proxy.$shape" "${tids[@]}" 2>"$SG_WORK/strace.log" &
  strace_pid=$!
  sleep 1
  load "$shape" "$N"
  kill -INT "$strace_pid"
  wait "$strace_pid" 2>/dev/null || true
  stop "$pid"
  # "% time, seconds, usecs/call, calls[, errors] total"
  calls=$(awk '$NF == "total" { print $4, (NF == 6 ? $5 : 0) }' "$SG_WORK/strace.$proxy.$shape" 2>/dev/null)
  [[ -n $calls ]] || { cat "$SG_WORK/strace.log" >&2; die "$proxy: strace gave no summary (log above)"; }
  read -r calls errors <<<"$calls"
  ROWS["$proxy $shape"]+=" $(per "${calls:-0}" "$N") $(per "${errors:-0}" "$N")"
  if [[ ${VERBOSE:-0} == 1 ]]; then cat "$SG_WORK/strace.$proxy.$shape"; fi
}

# heap_counts: the counting allocator's allocations and bytes so far.
# Fails when the build has no counting allocator.
heap_counts() {
  curl -fsS "http://127.0.0.1:$ADMIN/metrics" | awk '
    $1 == "shardgate_heap_allocations_total" { a = $2 }
    $1 == "shardgate_heap_allocated_bytes_total" { b = $2 }
    END { if (a == "" || b == "") exit 1; printf "%.0f %.0f\n", a, b }'
}

# alloc_counts SHAPE DIR: the counting allocator's allocations and bytes
# per request (ALLOC_BIN: a shardgate built with --features alloc-counts).
alloc_counts() {
  local shape=$1 dir=$2 before after
  [[ -n ${ALLOC_BIN:-} ]] || return 0
  spawn shardgate INT env RUST_LOG=error "$ALLOC_BIN" -c "$dir/shardgate.yaml"
  local pid=$SPAWNED
  wait_tcp $PORT "$pid" shardgate
  wait_http "http://127.0.0.1:$ADMIN/healthz" "$pid" shardgate
  load "$shape" "$W"
  local none="$ALLOC_BIN reports no shardgate_heap_* metrics (built without --features alloc-counts?)"
  before=$(heap_counts) || die "$none"
  load "$shape" "$N"
  after=$(heap_counts) || die "$none"
  # One scrape's own allocations (the end of one and the start of the
  # next), taken off.
  local idle0 idle1
  idle0=$(heap_counts) || die "$none"
  idle1=$(heap_counts) || die "$none"
  stop "$pid"
  read -r a0 b0 <<<"$before"
  read -r a1 b1 <<<"$after"
  read -r s0 t0 <<<"$idle0"
  read -r s1 t1 <<<"$idle1"
  a1=$((a1 - (s1 - s0))) b1=$((b1 - (t1 - t0)))
  ALLOC_ROWS[$shape]="$(per $((a1 - a0)) "$N") $(per $((b1 - b0)) "$N")"
}
declare -A ALLOC_ROWS=()

printf 'Counts per request: %s, commit %s; N=%s after W=%s\n' "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" \
  "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" "$N" "$W"
if perf stat -x, -e cycles true 2>&1 | grep -q '^[0-9]'; then
  printf 'perf stat: hardware counters available (not yet collected by this script)\n'
else
  printf 'perf stat: no hardware counters here (cycles, IPC, cache misses: n/a)\n'
fi
for f in $FEATURES; do
  case $f in base | plans-unused | plans | tracing-unsampled | tracing | compression | access-log) ;;
    *) die "unknown feature '$f' in FEATURES (base plans-unused plans tracing-unsampled tracing compression access-log)" ;;
  esac
done
read -r -a proxies <<<"$PROXIES"
for shape in $SHAPES; do
  dir=$(confs_of "$shape")
  for proxy in "${proxies[@]}"; do
    [[ $shape != h1grpc || $proxy != nginx ]] || continue
    callgrind_counts "$proxy" "$shape" "$dir"
    if [[ $SYSCALLS == 1 ]]; then syscall_counts "$proxy" "$shape" "$dir"; else ROWS["$proxy $shape"]+=" - -"; fi
  done
  alloc_counts "$shape" "$dir"
done

printf '\n%-6s %-10s %14s %12s %12s %16s\n' shape proxy instructions allocations syscalls "failed syscalls"
for shape in $SHAPES; do
  for proxy in "${proxies[@]}"; do
    [[ -n ${ROWS["$proxy $shape"]:-} ]] || continue
    read -r instr allocs calls errors <<<"${ROWS["$proxy $shape"]}"
    printf '%-6s %-10s %14s %12s %12s %16s\n' "$shape" "$proxy" "$instr" "$allocs" "$calls" "$errors"
  done
  if [[ -n ${ALLOC_ROWS[$shape]:-} ]]; then
    read -r allocs bytes <<<"${ALLOC_ROWS[$shape]}"
    printf '%-6s %-10s counting allocator: %s allocations, %s bytes per request\n' "$shape" shardgate "$allocs" "$bytes"
  fi
done

[[ -n $FEATURES ]] || exit 0
# Features: shardgate's GETs with each configured alone.
for f in $FEATURES; do
  callgrind_counts shardgate get "$(feature_conf "$f")" "$f"
done
base=${ROWS[base]:-}
printf '\nshardgate get, features configured alone (per request; +: instructions over base)\n'
printf '%-18s %14s %12s %10s\n' feature instructions allocations "+"
for f in $FEATURES; do
  read -r instr allocs <<<"${ROWS[$f]}"
  more=-
  [[ -z $base || $f == base ]] || more=$(awk -v a="$instr" -v b="${base%% *}" 'BEGIN { printf "%+.0f", a - b }')
  printf '%-18s %14s %12s %10s\n' "$f" "$instr" "$allocs" "$more"
done
if [[ -n $base ]]; then
  # What each feature's own functions run when it is not configured: the
  # calls into them from elsewhere, whole (code inlined into a caller is
  # the caller's, and not seen here).
  printf '\nbase: instructions per request inside each feature'"'"'s own functions (calls into them, whole)\n'
  for dump in "$SG_WORK"/cg.shardgate.get.base.*.1; do
    for pattern in limits::plans shardgate::trace:: pipeline::compression:: shardgate::access_log:: GatewayHooks; do
      inside=$(python3 "$HERE/callgrind_counts.py" "$dump" --inside "$pattern" | awk '$1 == "inside" { print $2 }')
      printf '  %-26s %8s\n' "$pattern" "$(per "${inside:-0}" "$N")"
    done
  done
fi
