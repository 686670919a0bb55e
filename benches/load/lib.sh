# shellcheck shell=bash
# Helpers shared by benches/load/compare.sh and benches/load/ws-idle.sh
# (sourced, not run): process tracking and clean-up, readiness polling,
# /proc accounting, and the configurations of the backends and proxies.
#
# Every process is started with `spawn`, which records it; `stop` ends one
# (and its descendants), and the EXIT trap set by `lib_init` stops whatever
# is still running and removes the temporary directory (KEEP=1 keeps it).

SG_PIDS=()            # processes we started, in start order
declare -A SG_SIG=()  # pid -> signal that stops it quickly
SG_WORK=""            # temporary directory
SPAWNED=""            # pid of the last `spawn`
SG_HEALTHZ=""         # does shardgate serve /healthz? (found at its first start)

die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

lib_init() {
  SG_WORK=$(mktemp -d "${TMPDIR:-/tmp}/shardgate-bench.XXXXXX")
  # nginx workers run as nobody: let them traverse the directory.
  chmod 755 "$SG_WORK"
  trap lib_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
}

lib_cleanup() {
  local rc=$? i
  trap - EXIT INT TERM HUP
  for ((i = ${#SG_PIDS[@]} - 1; i >= 0; i--)); do
    stop "${SG_PIDS[i]}"
  done
  if [[ -n $SG_WORK && -d $SG_WORK ]]; then
    if [[ ${KEEP:-0} == 1 ]]; then
      printf 'kept %s\n' "$SG_WORK" >&2
    else
      rm -rf "$SG_WORK"
    fi
  fi
  exit "$rc"
}

# spawn NAME SIGNAL CMD...: runs CMD in the background, stdout and stderr to
# $SG_WORK/NAME.log; SIGNAL is what stops it quickly (Pingora: INT; nginx,
# HAProxy: TERM). The pid is left in SPAWNED. Use `exec`-style wrappers only
# (env, taskset), so that the pid is the program's own.
spawn() {
  local name=$1 sig=$2
  shift 2
  "$@" >"$SG_WORK/$name.log" 2>&1 &
  SPAWNED=$!
  SG_PIDS+=("$SPAWNED")
  SG_SIG[$SPAWNED]=$sig
}

# alive PID: the process exists and is not a zombie.
alive() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $s ]] || return 1
  s=${s##*) }
  [[ ${s:0:1} != Z ]]
}

# descendants PID: children, grandchildren, … (one per line).
descendants() {
  local c
  for c in $(pgrep -P "$1" 2>/dev/null || true); do
    echo "$c"
    descendants "$c"
  done
}

# family PID: PID and its descendants, space-separated (nginx: master and
# workers).
family() {
  local out=$1 c
  for c in $(descendants "$1"); do out+=" $c"; done
  echo "$out"
}

# stop PID: sends the process its stop signal, waits up to 10 s for it and
# all its descendants to exit, SIGKILLs any left, and reaps it.
stop() {
  local pid=$1 sig=${SG_SIG[$1]:-TERM} p i any rest=()
  local fam
  read -r -a fam <<<"$(family "$pid")"
  kill -s "$sig" "$pid" 2>/dev/null || true
  for ((i = 0; i < 200; i++)); do
    any=0
    for p in "${fam[@]}"; do
      if alive "$p"; then any=1; break; fi
    done
    ((any)) || break
    sleep 0.05
  done
  for p in "${fam[@]}"; do
    if alive "$p"; then kill -KILL "$p" 2>/dev/null || true; fi
  done
  wait "$pid" 2>/dev/null || true
  for p in "${SG_PIDS[@]}"; do
    [[ $p == "$pid" ]] || rest+=("$p")
  done
  SG_PIDS=("${rest[@]}")
  unset "SG_SIG[$pid]"
}

# log_tail NAME: the end of a spawned process's log, for error messages.
log_tail() {
  tail -n 20 "$SG_WORK/$1.log" 2>/dev/null | sed 's/^/    /' >&2 || true
}

# parse_args SCRIPT ARGS...: the scripts' common arguments: --build sets
# BUILD=1; -h/--help prints SCRIPT's header comment and exits.
parse_args() {
  local script=$1 arg
  shift
  for arg in "$@"; do
    case $arg in
      --build) BUILD=1 ;;
      -h | --help)
        sed -n '2,/^set -euo/p' "$script" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
      *) die "unknown argument $arg (try --help)" ;;
    esac
  done
}

# wait_tcp PORT PID NAME [TIMEOUT_S]: polls until 127.0.0.1:PORT accepts a
# connection; fails if PID exits first or after TIMEOUT_S (default 30).
wait_tcp() {
  local port=$1 pid=$2 name=$3 deadline=$((SECONDS + ${4:-30}))
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    if ! alive "$pid"; then
      log_tail "$name"
      die "$name exited before 127.0.0.1:$port opened (log above)"
    fi
    if ((SECONDS >= deadline)); then
      log_tail "$name"
      die "$name: 127.0.0.1:$port not open after ${4:-30} s"
    fi
    sleep 0.05
  done
}

# wait_http URL PID NAME [TIMEOUT_S]: polls until URL answers 2xx.
wait_http() {
  local url=$1 pid=$2 name=$3 deadline=$((SECONDS + ${4:-30}))
  until curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null; do
    if ! alive "$pid"; then
      log_tail "$name"
      die "$name exited before $url answered (log above)"
    fi
    if ((SECONDS >= deadline)); then
      log_tail "$name"
      die "$name: $url did not answer 2xx within ${4:-30} s"
    fi
    sleep 0.05
  done
}

# port_free PORT: nothing listens on it.
port_free() {
  [[ -z $(ss -Htln "( sport = :$1 )" 2>/dev/null) ]]
}

check_ports_free() {
  local p
  for p in "$@"; do
    port_free "$p" || die "port $p is already in use (is another benchmark running?)"
  done
}

# cpu_ticks PID...: utime + stime (clock ticks) summed over the processes;
# a process's /proc/PID/stat counts all of its threads.
cpu_ticks() {
  local user sys
  read -r user sys <<<"$(cpu_ticks_split "$@")"
  echo $((user + sys))
}

# cpu_ticks_split PID...: "utime stime" (clock ticks), each summed over
# the processes.
cpu_ticks_split() {
  local u=0 s=0 p line f
  for p in "$@"; do
    line=$(cat "/proc/$p/stat")
    read -r -a f <<<"${line##*) }"
    # f[0] is field 3 (state): utime is field 14, stime field 15.
    u=$((u + f[11])) s=$((s + f[12]))
  done
  echo "$u $s"
}

# core_times: "busy total" clock ticks of cores 0 and 1 (from /proc/stat),
# as four numbers: busy0 total0 busy1 total1.
core_times() {
  awk '$1 == "cpu0" || $1 == "cpu1" {
    total = $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9
    printf "%d %d ", total - $5 - $6, total
  } END { print "" }' /proc/stat
}

# status_kib FIELD PID...: a /proc/PID/status field (VmRSS, VmHWM) in KiB,
# summed over the processes.
status_kib() {
  local field=$1
  shift
  local p
  for p in "$@"; do cat "/proc/$p/status"; done |
    awk -v f="$field:" '$1 == f { s += $2 } END { print s + 0 }'
}

# ---------------------------------------------------------------- configs

# nginx directives that keep an nginx instance inside DIR (nginx -p DIR/).
nginx_paths() {
  local dir=$1 name=$2
  cat <<EOF
    client_body_temp_path $dir/$name-tmp/body;
    proxy_temp_path       $dir/$name-tmp/proxy;
    fastcgi_temp_path     $dir/$name-tmp/fastcgi;
    uwsgi_temp_path       $dir/$name-tmp/uwsgi;
    scgi_temp_path        $dir/$name-tmp/scgi;
EOF
}

# write_backend_conf FILE PORT...: one nginx (one worker) answering
# `200 ok\n` on every PORT, to any method. It logs one line per *new
# connection* (the first request of each connection,
# `$connection_requests = 1`) with the connection's serial number:
# counting lines over a run counts the upstream connections a proxy opened
# (TCP-only probes that send no request, like shardgate's health checks,
# are not logged).
#
# Request bodies (compare.sh's post and upload shapes) of any size are
# accepted (client_max_body_size 0) and read in full *before* the answer,
# as an application would: nginx's `return` answers at once and discards
# the body afterwards, and an answer that overtakes the body makes a proxy
# close connections (nginx as the proxy closed the client's and the
# upstream connection after every 1 MiB upload: a wrk read error and a new
# upstream connection per request). Reading first takes the mirror module
# (PRECONTENT phase, `mirror_request_body on`: it reads the body, then
# runs a no-op subrequest), after which the content phase finds no file
# (`root` is a directory that does not exist: 404, not logged) and
# `error_page 404 =200` sends the same `ok\n` from @sg_ok. The body is
# held in memory (client_body_buffer_size 10m; with a Content-Length,
# nginx allocates just that), never on disk: a Content-Length of 10^7
# bytes or more skips the reading and is discarded while answering, as a
# request without a body is answered by `return` at once, as before.
# (Only a chunked body over 10 MiB would go to a file under backend-tmp/.)
write_backend_conf() {
  local file=$1
  shift
  local dir
  dir=$(dirname "$file")
  mkdir -p "$dir/backend-tmp"
  {
    cat <<EOF
worker_processes 1;
daemon off;
master_process on;
pid $dir/backend.pid;
error_log $dir/backend-error.log warn;
worker_rlimit_nofile 16384;
events { worker_connections 8192; }
http {
$(nginx_paths "$dir" backend)
    default_type text/plain;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    client_max_body_size 0;
    client_body_buffer_size 10m;
    root $dir/backend-no-such-dir;
    log_not_found off;
    # 1: answer at once (no body, or one of 10^7 bytes or more: discarded
    # while answering); 0: read the whole body first.
    map "\$http_content_length\$http_transfer_encoding" \$sg_answer_now {
        ""             1;
        "~^[0-9]{8,}\$" 1;
        default        0;
    }
    map \$connection_requests \$sg_first_request { 1 1; default 0; }
    log_format sg_conns '\$connection \$server_port \$msec';
    access_log $dir/backend-conns.log sg_conns if=\$sg_first_request;
EOF
    local p
    for p in "$@"; do
      cat <<EOF
    server {
        listen 127.0.0.1:$p backlog=4096;
        location / {
            if (\$sg_answer_now) { return 200 "ok\\n"; }
            mirror /_sg_body;
            error_page 404 =200 @sg_ok;
        }
        location = /_sg_body { internal; return 204; }
        location @sg_ok { return 200 "ok\\n"; }
    }
EOF
    done
    echo "}"
  } >"$file"
}

# write_shardgate_conf FILE PORT ADMIN_PORT BACKEND_PORT...
# SG_SERVER_EXTRA: more `server:` fields (`fast_path: false`);
# SG_LIMITS_EXTRA: one more `limits:` line (`max_body_bytes: null`);
# SG_LOG: the `log:` value (default `{ access: off }`; `{dir}` = FILE's folder);
# SG_EXTRA: more top-level lines (`tracing: { ... }`).
# limits.max_body_bytes is left at its default (100 MiB) unless set so.
write_shardgate_conf() {
  local file=$1 port=$2 admin=$3
  shift 3
  local dir i=0 p
  dir=$(dirname "$file")
  {
    cat <<EOF
server: { threads: 1, pid_file: $dir/shardgate.pid, upgrade_sock: $dir/shardgate.sock${SG_SERVER_EXTRA:+, $SG_SERVER_EXTRA} }
listen: [{ addr: 127.0.0.1:$port }]
admin: { addr: 127.0.0.1:$admin }
state: false
shards:
EOF
    for p in "$@"; do
      i=$((i + 1))
      printf '  - { id: s%d, url: "http://127.0.0.1:%s" }\n' "$i" "$p"
    done
    cat <<EOF
limits:
  connection_cap: 100000
  rate: { tokens: 1000000000, refill_per_second: 1000000000 }
  routes:
    /api/export: { tokens: 1000000000, refill_per_second: 1000000000 }
${SG_LIMITS_EXTRA:+  $SG_LIMITS_EXTRA
}domains: { fallback_suffix: .localhost }
log: ${SG_LOG:-"{ access: off }"}
${SG_EXTRA:-}
EOF
  } >"$file"
  sed -i "s|{dir}|$dir|g" "$file"
}

# write_nginx_proxy_conf FILE MODE PORT MAXCONN BACKEND_PORT...
# MODE http: upstream keep-alive (HTTP/1.1, `Connection: ""`);
# MODE ws: the usual WebSocket pass-through (Upgrade/Connection "upgrade"),
# with an idle WebSocket allowed to stay for an hour.
# Both: `hash $host consistent`, any Host accepted, and the same forwarding
# fields shardgate sets (X-Forwarded-For/-Host/-Proto, X-Tenant-Id = the
# host's first label).
write_nginx_proxy_conf() {
  local file=$1 mode=$2 port=$3 maxconn=$4
  shift 4
  local dir p
  dir=$(dirname "$file")
  mkdir -p "$dir/nginx-tmp"
  {
    cat <<EOF
worker_processes 1;
daemon off;
master_process on;
pid $dir/nginx.pid;
error_log $dir/nginx-error.log warn;
worker_rlimit_nofile $((2 * maxconn + 256));
events { worker_connections $((2 * maxconn + 128)); }
http {
$(nginx_paths "$dir" nginx)
    access_log off;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    # Request bodies of any size, streamed to the shard as they arrive (the
    # default, proxy_request_buffering on, reads the whole body first and
    # spills any over client_body_buffer_size, 16 KiB, to a temporary file).
    client_max_body_size 0;
    proxy_request_buffering off;
    map \$host \$sg_tenant { ~^(?<t>[^.]+)\. \$t; default \$host; }
    upstream shards {
        hash \$host consistent;
EOF
    for p in "$@"; do
      printf '        server 127.0.0.1:%s;\n' "$p"
    done
    cat <<EOF
        keepalive 1024;
        keepalive_requests 100000000;
        keepalive_timeout 300s;
    }
    server {
        listen 127.0.0.1:$port default_server backlog=4096;
        server_name _;
        location / {
            proxy_pass http://shards;
            proxy_http_version 1.1;
            proxy_set_header Host \$host;
            proxy_set_header X-Forwarded-For \$remote_addr;
            proxy_set_header X-Forwarded-Host \$host;
            proxy_set_header X-Forwarded-Proto \$scheme;
            proxy_set_header X-Tenant-Id \$sg_tenant;
EOF
    if [[ $mode == ws ]]; then
      cat <<'EOF'
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
EOF
    else
      cat <<'EOF'
            proxy_set_header Connection "";
EOF
    fi
    cat <<'EOF'
        }
    }
}
EOF
  } >"$file"
}

# write_haproxy_conf FILE PORT MAXCONN BACKEND_PORT...
# `balance hdr(host)`, `hash-type consistent`, `http-reuse always`, one
# thread, the same forwarding fields; `timeout tunnel` lets an idle
# WebSocket stay for an hour. HAPROXY_TLS=PEM (certificate and key in one
# file): the bind is TLS, offering h2 and http/1.1.
write_haproxy_conf() {
  local file=$1 port=$2 maxconn=$3
  shift 3
  local i=0 p bind="" proto=http
  if [[ -n ${HAPROXY_TLS:-} ]]; then
    bind=" ssl crt $HAPROXY_TLS alpn h2,http/1.1 ssl-min-ver TLSv1.2"
    proto=https
  fi
  {
    cat <<EOF
global
    nbthread 1
    maxconn $maxconn
    log stderr format raw local0 emerg

defaults
    mode http
    option http-keep-alive
    timeout connect 5s
    timeout client 300s
    timeout server 300s
    timeout http-keep-alive 300s
    timeout http-request 10s
    timeout tunnel 3600s

frontend fe
    bind 127.0.0.1:$port$bind
    option forwardfor
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
    http-request set-header X-Forwarded-Proto $proto
    http-request set-header X-Tenant-Id %[req.hdr(host),field(1,.)]
    default_backend shards

backend shards
    balance hdr(host)
    hash-type consistent
    http-reuse always
EOF
    for p in "$@"; do
      i=$((i + 1))
      printf '    server s%d 127.0.0.1:%s\n' "$i" "$p"
    done
  } >"$file"
}

# write_grpc_confs DIR PORT ADMIN_PORT BACKEND_PORT CLIENT: shardgate.yaml,
# nginx.conf and haproxy.cfg in DIR for gRPC over h2c to one HTTP/2 backend
# (shardgate: a `protocol: h2` shard; nginx: `grpc_pass`; HAProxy: `proto
# h2` to the server, and on the bind unless CLIENT is h1).
write_grpc_confs() {
  local dir=$1 port=$2 admin=$3 backend=$4 client=$5
  cat >"$dir/shardgate.yaml" <<CONF
server: { threads: 1, pid_file: $dir/shardgate.pid, upgrade_sock: $dir/shardgate.sock }
listen: [{ addr: 127.0.0.1:$port }]
admin: { addr: 127.0.0.1:$admin }
state: false
shards:
  - { id: g1, url: "http://127.0.0.1:$backend", protocol: h2 }
limits:
  connection_cap: 100000
  rate: { tokens: 1000000000, refill_per_second: 1000000000 }
domains: { map: { localhost: t } }
log: { access: off }
CONF
  mkdir -p "$dir/nginx-tmp"
  cat >"$dir/nginx.conf" <<CONF
worker_processes 1;
daemon off;
master_process on;
pid $dir/nginx.pid;
error_log $dir/nginx-error.log warn;
events { worker_connections 4096; }
http {
$(nginx_paths "$dir" nginx)
    access_log off;
    keepalive_requests 100000000;
    http2_max_concurrent_streams 1024;
    upstream grpc_shards {
        server 127.0.0.1:$backend;
        keepalive 1024;
        keepalive_requests 100000000;
    }
    server {
        listen 127.0.0.1:$port http2 default_server;
        server_name _;
        location / {
            grpc_pass grpc://grpc_shards;
            grpc_set_header X-Forwarded-For \$remote_addr;
        }
    }
}
CONF
  cat >"$dir/haproxy.cfg" <<CONF
global
    nbthread 1
    maxconn 4096
    log stderr format raw local0 emerg
defaults
    mode http
    timeout connect 5s
    timeout client 300s
    timeout server 300s
frontend fe
    bind 127.0.0.1:$port $([[ $client == h2 ]] && echo proto h2)
    option forwardfor
    default_backend grpc_shards
backend grpc_shards
    http-reuse always
    server g1 127.0.0.1:$backend proto h2
CONF
}

# ----------------------------------------------------------- the proxies

# resolve_shardgate_bin ROOT CALLER_PWD: sets SHARDGATE_BIN to an absolute
# path (a relative SHARDGATE_BIN is taken from the caller's directory if it
# exists there, else from the repository root); with BUILD=1 (or --build),
# builds it first.
resolve_shardgate_bin() {
  local root=$1 caller=$2
  SHARDGATE_BIN=${SHARDGATE_BIN:-target/release/shardgate}
  if [[ ${BUILD:-0} == 1 ]]; then
    (cd "$root" && cargo build --release --bin shardgate)
  fi
  if [[ $SHARDGATE_BIN != /* ]]; then
    if [[ -x $caller/$SHARDGATE_BIN ]]; then
      SHARDGATE_BIN=$caller/$SHARDGATE_BIN
    else
      SHARDGATE_BIN=$root/$SHARDGATE_BIN
    fi
  fi
  [[ -x $SHARDGATE_BIN ]] ||
    die "no shardgate binary at $SHARDGATE_BIN: build it (cargo build --release --bin shardgate), run with BUILD=1, or set SHARDGATE_BIN"
}

# start_proxy KIND CONF PORT [ADMIN_PORT]: starts shardgate, nginx or
# haproxy pinned to core 0 and waits until it is ready (shardgate: its
# listener accepts and its admin /healthz answers 200; nginx, HAProxy: the
# listener accepts). A shardgate build without the admin API is detected at its
# first start (noted once), and then only its listener is awaited. The pid
# (nginx: the master) is left in SPAWNED.
start_proxy() {
  local kind=$1 conf=$2 port=$3 admin=${4:-}
  case $kind in
    shardgate)
      spawn shardgate INT env RUST_LOG=error taskset -c 0 "$SHARDGATE_BIN" -c "$conf"
      wait_tcp "$port" "$SPAWNED" shardgate
      if [[ -z $SG_HEALTHZ ]]; then
        # First start: does this build serve the admin API? (Poll up to 5 s.)
        SG_HEALTHZ=no
        local i
        for ((i = 0; i < 100; i++)); do
          if curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$admin/healthz" 2>/dev/null; then
            SG_HEALTHZ=yes
            break
          fi
          alive "$SPAWNED" || break
          sleep 0.05
        done
        [[ $SG_HEALTHZ == yes ]] ||
          printf 'note: shardgate answers no GET 127.0.0.1:%s/healthz (no admin API in this build?): ready = its listener accepts\n' "$admin"
      elif [[ $SG_HEALTHZ == yes ]]; then
        wait_http "http://127.0.0.1:$admin/healthz" "$SPAWNED" shardgate
      fi
      ;;
    nginx)
      spawn nginx TERM taskset -c 0 nginx -p "$(dirname "$conf")/" -c "$conf" -e "$(dirname "$conf")/nginx-error.log"
      ;;
    haproxy)
      spawn haproxy TERM taskset -c 0 haproxy -db -f "$conf"
      ;;
    *) die "unknown proxy $kind" ;;
  esac
  wait_tcp "$port" "$SPAWNED" "$kind"
}
