# shellcheck shell=bash
# Helpers shared by benches/load/soak.sh and benches/load/slowloris.sh
# (sourced after lib.sh, not run): the certificate, a backend that counts
# the requests of the rapid-reset probe, a free port, the abuse probes
# (edge_probe.py) and the reading of their results. Expects `here` (this
# directory) to be set by the caller, as every script here does.

# make_cert DIR NAME: a self-signed ECDSA P-256 certificate for *.localhost
# and localhost, DIR/NAME.crt and DIR/NAME.key (shardgate's tls.certs layout).
make_cert() {
  mkdir -p "$1"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=bench" -addext "subjectAltName=DNS:*.localhost,DNS:localhost" \
    -keyout "$1/$2.key" -out "$1/$2.crt" 2>/dev/null || die "openssl could not make a certificate"
}

# free_port: a TCP port nothing listens on (asked of the kernel).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# write_counting_backend_conf DIR PORT...: one nginx (one worker, pid and
# logs in DIR) answering `200 ok\n` on every PORT to any method (small
# bodies are read and discarded). Every request whose path starts with
# /rapid-reset (the rapid-reset probe's) is logged to DIR/rapid.log, one
# line each, whatever its outcome: the lines count the reset streams that
# reached a shard. Other requests are not logged.
write_counting_backend_conf() {
  local dir=$1 p
  shift
  mkdir -p "$dir/backend-tmp"
  {
    cat <<EOF
worker_processes 1;
daemon off;
master_process on;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
worker_rlimit_nofile 16384;
events { worker_connections 8192; }
http {
$(nginx_paths "$dir" backend)
    default_type text/plain;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    client_max_body_size 0;
    map \$uri \$sg_rapid { ~^/rapid-reset 1; default 0; }
    log_format sg_rapid '\$msec \$server_port \$status \$request_uri';
    access_log $dir/rapid.log sg_rapid if=\$sg_rapid;
EOF
    for p in "$@"; do
      printf '    server { listen 127.0.0.1:%s backlog=4096; location / { return 200 "ok\\n"; } }\n' "$p"
    done
    echo "}"
  } >"$dir/nginx.conf"
  touch "$dir/rapid.log"
}

# rapid_count DIR...: lines in DIR/rapid.log, summed.
rapid_count() {
  local d n=0
  for d in "$@"; do n=$((n + $(wc -l <"$d/rapid.log"))); done
  echo "$n"
}

# raise_nofile NEED: raises `ulimit -n` to NEED (else as far as it goes);
# fails when it stays below.
raise_nofile() {
  if (($(ulimit -n) < $1)); then
    ulimit -n "$1" 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  fi
  (($(ulimit -n) >= $1)) ||
    die "ulimit -n is $(ulimit -n) (hard limit $(ulimit -Hn)): $1 needed; lower SLOW"
}

# SLOW_KINDS: the three silent-socket kinds; slow_split TOTAL KIND: the
# kind's share of TOTAL (plain gets the remainder).
SLOW_KINDS=(plain tls h2)
slow_split() {
  local total=$1 kind=$2
  case $kind in
    plain) echo $((total - 2 * (total / 3))) ;;
    *) echo $((total / 3)) ;;
  esac
}

# start_slowloris NAME PLAIN_PORT TLS_PORT TOTAL DURATION LIMIT_MS STAGGER_MS:
# spawns one edge_probe.py slowloris per kind (logs NAME-<kind>.log, status
# files NAME-<kind>.status); their pids in SLOW_PIDS, their names in
# SLOW_NAMES.
SLOW_PIDS=()
SLOW_NAMES=()
# shellcheck disable=SC2154 # here: set by the caller
start_slowloris() {
  local name=$1 plain=$2 tls=$3 total=$4 duration=$5 limit=$6 stagger=$7 kind port n
  SLOW_PIDS=()
  SLOW_NAMES=()
  for kind in "${SLOW_KINDS[@]}"; do
    n=$(slow_split "$total" "$kind")
    ((n > 0)) || continue
    port=$tls
    [[ $kind == plain ]] && port=$plain
    spawn "$name-$kind" TERM python3 "$here/edge_probe.py" slowloris --target "127.0.0.1:$port" \
      --kind "$kind" --count "$n" --duration "$duration" --limit-ms "$limit" --stagger-ms "$stagger" \
      --status "$SG_WORK/$name-$kind.status"
    SLOW_PIDS+=("$SPAWNED")
    SLOW_NAMES+=("$name-$kind")
  done
}

# slow_open NAME: "plain/tls/h2" sockets open now (from the status files).
slow_open() {
  local kind out="" v
  for kind in "${SLOW_KINDS[@]}"; do
    v=$(sed -n 's/^open=\([0-9]*\).*/\1/p' "$SG_WORK/$1-$kind.status" 2>/dev/null || true)
    out+="${out:+/}${v:--}"
  done
  echo "$out"
}

# wait_probe PID NAME [GRACE_S]: waits for a probe that ends by itself (up to
# GRACE_S seconds, default 30, more than its duration is not needed: the
# caller waits until the run's end first), then stops it; prints its
# RESULT json (empty if none).
wait_probe() {
  local pid=$1 name=$2 grace=${3:-30} deadline
  deadline=$((SECONDS + grace))
  while alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
  stop "$pid"
  sed -n 's/^RESULT //p' "$SG_WORK/$name.log" | tail -n 1
}
