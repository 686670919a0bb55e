#!/usr/bin/env bash
# Response compression (DESIGN §10): the proxy's CPU per MB of body it
# compresses, and the size it sends, for a JSON and an HTML document
# (105 and 139 KiB, served uncompressed by a backend nginx): shardgate with
# gzip at LEVEL against nginx's `gzip` at the same level, and shardgate's
# brotli and zstd at their default (edge) levels. wrk asks for one coding
# per run (`Accept-Encoding`), on CONNS connections for SECS seconds;
# proxies are pinned to core 0, wrk and the backend to core 1.
# Interleaved over ROUNDS rounds; prints medians (min-max) and the ratio
# of shardgate's gzip CPU to nginx's.
#
#   bash benches/load/compression.sh [--build]
#
# Environment (defaults):
#   SHARDGATE_BIN=target/release/shardgate
#   BUILD=0      1 (or --build): build it first
#   ROUNDS=3     rounds
#   SECS=4       seconds per run
#   CONNS=8      connections
#   LEVEL=4      gzip level of both proxies
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CALLER=$PWD
# shellcheck source=benches/load/lib.sh
source "$HERE/lib.sh"
parse_args "$0" "$@"
ROUNDS=${ROUNDS:-3} SECS=${SECS:-4} CONNS=${CONNS:-8} LEVEL=${LEVEL:-4}
resolve_shardgate_bin "$ROOT" "$CALLER"
command -v wrk >/dev/null || die "wrk is missing (apt-get install wrk)"
command -v nginx >/dev/null || die "nginx is missing (apt-get install nginx)"
lib_init

BACKEND=18301 PORT=18380 ADMIN=18381
check_ports_free $BACKEND $PORT $ADMIN
DOCS=$SG_WORK/docs
mkdir -p "$DOCS" "$SG_WORK/backend-tmp" "$SG_WORK/nginx-tmp"
chmod 755 "$DOCS"
# 105 and 139 KiB, text as apps send it: repetitive but not trivial.
python3 - "$DOCS" <<'PY'
import json, random, sys
random.seed(7)
words = "alpha beta gamma delta tenant shard route bucket region plan quota edge".split()
items = [{"id": i, "name": " ".join(random.choice(words) for _ in range(4)),
          "score": round(random.random() * 1000, 3), "tags": random.sample(words, 3),
          "active": i % 3 == 0} for i in range(900)]
open(sys.argv[1] + "/doc.json", "w").write(json.dumps({"items": items}))
rows = "".join(f'<tr class="row"><td>{i}</td><td>{" ".join(random.choice(words) for _ in range(5))}</td>'
               f'<td><a href="/item/{i}">open</a></td></tr>\n' for i in range(1300))
open(sys.argv[1] + "/doc.html", "w").write(f"<!doctype html><html><body><table>\n{rows}</table></body></html>\n")
PY
cat >"$SG_WORK/backend.conf" <<CONF
worker_processes 1;
daemon off;
pid $SG_WORK/backend.pid;
error_log $SG_WORK/backend-error.log warn;
events { worker_connections 1024; }
http {
$(nginx_paths "$SG_WORK" backend)
    access_log off;
    types { application/json json; text/html html; }
    keepalive_requests 100000000;
    server { listen 127.0.0.1:$BACKEND; root $DOCS; gzip off; etag on; }
}
CONF
spawn backend TERM taskset -c 1 nginx -p "$SG_WORK/" -c "$SG_WORK/backend.conf" -e "$SG_WORK/backend-error.log"
wait_tcp $BACKEND "$SPAWNED" backend

cat >"$SG_WORK/shardgate.yaml" <<CONF
server: { threads: 1, pid_file: $SG_WORK/shardgate.pid, upgrade_sock: $SG_WORK/shardgate.sock }
listen: [{ addr: 127.0.0.1:$PORT }]
admin: { addr: 127.0.0.1:$ADMIN }
state: false
shards: [{ id: s1, url: "http://127.0.0.1:$BACKEND" }]
limits: { connection_cap: 100000 }
domains: { map: { localhost: t } }
log: { access: off }
compression: { algorithms: [zstd, br, gzip], levels: { gzip: $LEVEL } }
CONF
cat >"$SG_WORK/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $SG_WORK/nginx.pid;
error_log $SG_WORK/nginx-error.log warn;
events { worker_connections 4096; }
http {
$(nginx_paths "$SG_WORK" nginx)
    access_log off;
    keepalive_requests 100000000;
    upstream shards { server 127.0.0.1:$BACKEND; keepalive 64; }
    gzip on;
    gzip_comp_level $LEVEL;
    gzip_min_length 1024;
    gzip_types application/json text/html;
    gzip_vary on;
    server {
        listen 127.0.0.1:$PORT default_server;
        location / { proxy_pass http://shards; proxy_http_version 1.1; proxy_set_header Connection ""; }
    }
}
CONF

declare -A RESULTS=()
# run_one PROXY CODING DOC ROUND: one measured run.
run_one() {
  local proxy=$1 coding=$2 doc=$3 conf pid pids before after out requests size cpu mb
  case $proxy in
    shardgate) conf=$SG_WORK/shardgate.yaml ;;
    nginx) conf=$SG_WORK/nginx.conf ;;
  esac
  start_proxy "$proxy" "$conf" $PORT $ADMIN
  pid=$SPAWNED
  local url="http://localhost:$PORT/doc.$doc"
  # The compressed size (and that the coding is the one asked for).
  local head
  head=$(curl -sS -D - -o "$SG_WORK/body" -H "Accept-Encoding: $coding" "$url")
  grep -qi "^content-encoding: $coding" <<<"$head" || die "$proxy sent no $coding for $doc"
  size=$(stat -c %s "$SG_WORK/body")
  taskset -c 1 wrk -t1 -c "$CONNS" -d 1s -H "Accept-Encoding: $coding" "$url" >/dev/null 2>&1 || true
  read -r -a pids <<<"$(family "$pid")"
  before=$(cpu_ticks "${pids[@]}")
  out=$(taskset -c 1 wrk -t1 -c "$CONNS" -d "${SECS}s" -H "Accept-Encoding: $coding" "$url" 2>&1)
  after=$(cpu_ticks "${pids[@]}")
  stop "$pid"
  ! grep -q 'Non-2xx' <<<"$out" || { printf '%s\n' "$out" >&2; die "$proxy: answers other than 2xx"; }
  requests=$(awk '/requests in/ { print $1 }' <<<"$out")
  mb=$(awk -v n="$requests" -v s="$(stat -c %s "$DOCS/doc.$doc")" 'BEGIN { print n * s / 1048576 }')
  cpu=$(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v mb="$mb" 'BEGIN { printf "%.2f", t * 1000 / hz / mb }')
  printf '%-5s %-4s %-9s %-4s %7s req  %7s bytes  CPU %7s ms/MB\n' "$4" "$doc" "$proxy" "$coding" "$requests" "$size" "$cpu"
  RESULTS["$doc $proxy $coding"]+="$cpu $size;"
}

printf 'Compression, gzip level %s: %s, commit %s\n' "$LEVEL" "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
printf '  %s; json %s bytes, html %s bytes\n' "$(nginx -v 2>&1)" "$(stat -c %s "$DOCS/doc.json")" "$(stat -c %s "$DOCS/doc.html")"
RUNS=("nginx gzip" "shardgate gzip" "shardgate br" "shardgate zstd")
for ((r = 1; r <= ROUNDS; r++)); do
  for doc in json html; do
    n=${#RUNS[@]}
    for ((k = 0; k < n; k++)); do
      read -r proxy coding <<<"${RUNS[(k + r) % n]}"
      run_one "$proxy" "$coding" "$doc" "$r/$ROUNDS"
    done
  done
done

median() { tr ' ' '\n' | sort -n | awk 'NF { v[++n] = $1 } END { m = v[int((n + 1) / 2)]; printf "%s (%s-%s)", m, v[1], v[n] }'; }
column_of() { tr ';' '\n' | awk -v c="$1" 'NF { printf "%s ", $c }'; }
printf '\n%-5s %-16s %-28s %-10s %s\n' doc proxy "CPU ms/MB" "bytes" "CPU / nginx gzip"
for doc in json html; do
  base=$(column_of 1 <<<"${RESULTS["$doc nginx gzip"]}" | tr ' ' '\n' | sort -n | awk 'NF { v[++n] = $1 } END { print v[int((n + 1) / 2)] }')
  for run in "${RUNS[@]}"; do
    rows=${RESULTS["$doc $run"]:-}
    [[ -n $rows ]] || continue
    med=$(column_of 1 <<<"$rows" | tr ' ' '\n' | sort -n | awk 'NF { v[++n] = $1 } END { print v[int((n + 1) / 2)] }')
    printf '%-5s %-16s %-28s %-10s %s\n' "$doc" "$run" "$(column_of 1 <<<"$rows" | median)" \
      "$(column_of 2 <<<"$rows" | awk '{ print $1 }')" "$(awk -v a="$med" -v b="$base" 'BEGIN { printf "%.2f", a / b }')"
  done
done
