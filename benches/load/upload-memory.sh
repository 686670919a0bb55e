#!/usr/bin/env bash
# The memory bound for uploads: does shardgate stream request bodies, or
# hold them?
#
# Starts one backend that reads every request body in full and discards it
# (python3, standard library only: 1 MiB reads, Content-Length or chunked,
# then `200` with the byte count), and shardgate (pinned to core 0, one
# thread, limits.max_body_bytes unlimited) routing to it; waits until it is
# ready, sends one 1 MiB warm-up upload, reads its idle RSS (VmRSS), then
# runs UPLOADS concurrent uploads of SIZE_MIB MiB each through it with curl
# (`POST /upload`, `-T` from one sparse file: streamed, Content-Length; or
# chunked with CHUNKED=1), one tenant each, on core 1 with the backend.
# While they run it samples the gateway's VmRSS every 100 ms (and resets
# VmHWM after the idle reading, so that VmHWM is the kernel's own peak over
# the uploads); it prints idle RSS, peak RSS, peak - idle, the bytes moved
# (sent by curl, received by the backend), wall time, throughput, the
# uploads that got a 200, and PASS/FAIL: every upload 200 and peak - idle
# at most LIMIT_MIB. With PROXIES="shardgate nginx", nginx (one worker,
# proxy_request_buffering off: it streams bodies too) runs the same way
# afterwards, for comparison. See benches/load/README.md.
#
#   bash benches/load/upload-memory.sh [--build]
#   UPLOADS=4 SIZE_MIB=32 bash benches/load/upload-memory.sh      # a quick look
#
# Environment (defaults):
#   UPLOADS=64        concurrent uploads
#   SIZE_MIB=256      body of each upload, MiB
#   LIMIT_MIB=64      the bound on peak - idle RSS, MiB
#   CHUNKED=0         1: send the bodies chunked (Transfer-Encoding: chunked)
#   PROXIES=shardgate any of: shardgate nginx (run one after the other)
#   TIMEOUT=600       seconds an upload may take (curl --max-time)
#   SHARDGATE_BIN=target/release/shardgate   the gateway (relative: from the
#                     current directory if there, else from the repo root)
#   BUILD=0           1 (or --build): cargo build --release --bin shardgate first
#   KEEP=0            1: keep the temporary directory (configs, logs)
# Ports: backend 18501, shardgate 18580 (admin 18590), nginx 18581; all on
# 127.0.0.1. Exit status 1 when shardgate FAILs.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
caller=$PWD
# shellcheck source=lib.sh
source "$here/lib.sh"

parse_args "$0" "$@"

UPLOADS=${UPLOADS:-64}
SIZE_MIB=${SIZE_MIB:-256}
LIMIT_MIB=${LIMIT_MIB:-64}
CHUNKED=${CHUNKED:-0}
PROXIES=${PROXIES:-shardgate}
TIMEOUT=${TIMEOUT:-600}

for v in UPLOADS SIZE_MIB LIMIT_MIB TIMEOUT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
[[ $CHUNKED == 0 || $CHUNKED == 1 ]] || die "CHUNKED must be 0 or 1 (got '$CHUNKED')"
read -r -a proxies <<<"$PROXIES"
((${#proxies[@]} > 0)) || die "PROXIES is empty"
for p in "${proxies[@]}"; do
  case $p in shardgate | nginx) ;; *) die "unknown proxy '$p' in PROXIES (shardgate, nginx)" ;; esac
done
tools=(curl python3 taskset truncate ss pgrep)
[[ " $PROXIES " != *" nginx "* ]] || tools+=(nginx)
for t in "${tools[@]}"; do
  command -v "$t" >/dev/null || die "$t is needed (Debian: apt-get install curl python3 nginx-light iproute2 procps)"
done
(($(nproc) >= 2)) || die "needs 2 cores (the proxy on core 0, curl and the backend on core 1)"
[[ " $PROXIES " != *" shardgate "* ]] || resolve_shardgate_bin "$root" "$caller"
cd "$root"

BACKEND_PORT=18501 SG_PORT=18580 SG_ADMIN=18590 NGINX_PORT=18581
check_ports_free "$BACKEND_PORT" "$SG_PORT" "$SG_ADMIN" "$NGINX_PORT"
# Each upload: a client and an upstream socket at the proxy, one at the
# backend, one in curl.
(($(ulimit -n) >= 4 * UPLOADS + 256)) || ulimit -n $((4 * UPLOADS + 256)) 2>/dev/null ||
  die "ulimit -n is $(ulimit -n): too low for $UPLOADS uploads"

lib_init

# The backend: reads every body in full (1 MiB reads into one buffer per
# thread, nothing kept), then answers 200 with the byte count; one line per
# request on stdout (`BODY <host> <bytes>`) so that the script can add up
# what arrived.
cat >"$SG_WORK/sink.py" <<'PY'
import http.server
import sys

BUF = 1 << 20


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def read_exactly(self, view, n):
        while n:
            got = self.rfile.readinto(view[: min(n, BUF)])
            if not got:
                raise ConnectionError("body cut short")
            n -= got

    def body(self):
        view = memoryview(bytearray(BUF))
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            total = 0
            while True:
                size = int(self.rfile.readline(1024).split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline(65536).strip():  # trailers
                        pass
                    return total
                self.read_exactly(view, size)
                self.rfile.readline(8)  # CRLF
                total += size
        n = int(self.headers.get("Content-Length") or 0)
        self.read_exactly(view, n)
        return n

    def do_POST(self):
        n = self.body()
        # Logged before the answer: once the client has its 200, the line
        # is there.
        sys.stdout.write("BODY %s %d\n" % (self.headers.get("Host", "-"), n))
        sys.stdout.flush()
        text = b"%d\n" % n
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    do_PUT = do_POST

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")


class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 1024
    daemon_threads = True


Server(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
spawn backend TERM taskset -c 1 python3 -u "$SG_WORK/sink.py" "$BACKEND_PORT"
backend_pid=$SPAWNED
wait_tcp "$BACKEND_PORT" "$backend_pid" backend
backend_log=$SG_WORK/backend.log

SG_LIMITS_EXTRA="max_body_bytes: null" \
  write_shardgate_conf "$SG_WORK/shardgate.yaml" "$SG_PORT" "$SG_ADMIN" "$BACKEND_PORT"
[[ " $PROXIES " != *" nginx "* ]] ||
  write_nginx_proxy_conf "$SG_WORK/nginx.conf" http "$NGINX_PORT" $((UPLOADS + 1024)) "$BACKEND_PORT"

# One sparse file for every upload (no disk space, reads are zeros from the
# page cache), and a 1 MiB one for the warm-up.
body=$SG_WORK/body
truncate -s "${SIZE_MIB}M" "$body"
truncate -s 1M "$SG_WORK/warmup"
size_bytes=$((SIZE_MIB * 1048576))
framing="Content-Length"
curl_framing=()
if [[ $CHUNKED == 1 ]]; then
  framing="chunked"
  curl_framing=(-H "Transfer-Encoding: chunked")
fi

echo "shardgate upload memory: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
[[ " $PROXIES " != *" shardgate "* ]] ||
  echo "  shardgate: $SHARDGATE_BIN ($("$SHARDGATE_BIN" --version 2>/dev/null || echo '?'))"
[[ " $PROXIES " != *" nginx "* ]] || echo "  $(nginx -v 2>&1) (proxy_request_buffering off)"
echo "  $(curl --version | head -n 1 | cut -d' ' -f1-2), $(python3 --version) backend; proxy on core 0, curl and the backend on core 1"
echo "  $UPLOADS concurrent uploads x $SIZE_MIB MiB ($framing), limit on peak - idle RSS: $LIMIT_MIB MiB"
echo

# running PID: the process exists and is not a zombie (bash builtins only:
# it is called for every upload every 100 ms).
running() {
  local s
  read -r s 2>/dev/null <"/proc/$1/stat" || return 1
  s=${s##*) }
  [[ ${s:0:1} != Z ]]
}

# vm_kib FIELD PID...: sets VM_KIB to a /proc/PID/status field (KiB) summed
# over the processes (bash builtins only).
VM_KIB=0
vm_kib() {
  local field=$1 p k v rest
  shift
  VM_KIB=0
  for p in "$@"; do
    while read -r k v rest; do
      if [[ $k == "$field:" ]]; then
        VM_KIB=$((VM_KIB + v))
        break
      fi
    done 2>/dev/null <"/proc/$p/status" || true
  done
}

now_us() {
  local t=${EPOCHREALTIME:-}
  t=${t//[.,]/}
  echo "${t:-$(date +%s%6N)}"
}

declare -A R_OK R_IDLE R_PEAK R_SENT R_RECV R_WALL R_VERDICT
failed=0

# measure PROXY: the warm-up, the idle reading, UPLOADS uploads, the
# readings; prints the results and fills the R_* arrays.
measure() {
  local proxy=$1 port pid fam=() p i from t0 t1 idle peak=0 hwm hwm_reset=1 samples=0
  case $proxy in
    shardgate)
      port=$SG_PORT
      start_proxy shardgate "$SG_WORK/shardgate.yaml" "$port" "$SG_ADMIN"
      ;;
    nginx)
      port=$NGINX_PORT
      start_proxy nginx "$SG_WORK/nginx.conf" "$port"
      ;;
  esac
  pid=$SPAWNED
  read -r -a fam <<<"$(family "$pid")"

  # Warm-up: first-use allocations belong to the idle reading.
  local code
  code=$(taskset -c 1 curl -sS -o /dev/null -w '%{http_code}' --max-time 60 -H 'Expect:' \
    -H "Host: tenant-0.localhost" -H 'Content-Type: application/octet-stream' "${curl_framing[@]}" \
    -X POST -T "$SG_WORK/warmup" "http://127.0.0.1:$port/upload" 2>&1) || true
  [[ $code == 200 ]] || {
    log_tail "$proxy"
    die "$proxy: the warm-up upload got '$code', not 200 (log above)"
  }

  vm_kib VmRSS "${fam[@]}"
  idle=$VM_KIB
  for p in "${fam[@]}"; do
    echo 5 2>/dev/null >"/proc/$p/clear_refs" || hwm_reset=0
  done
  from=$(stat -c %s "$backend_log")

  local curls=()
  t0=$(now_us)
  for ((i = 1; i <= UPLOADS; i++)); do
    spawn "curl-$proxy-$i" TERM taskset -c 1 curl -sS -o /dev/null \
      -w 'RESULT %{http_code} %{size_upload} %{time_total}\n' \
      --connect-timeout 5 --max-time "$TIMEOUT" -H 'Expect:' -H "Host: tenant-$i.localhost" \
      -H 'Content-Type: application/octet-stream' "${curl_framing[@]}" \
      -X POST -T "$body" "http://127.0.0.1:$port/upload"
    curls+=("$SPAWNED")
  done

  # Sample every 100 ms until every upload has ended.
  local left=${#curls[@]} c
  while ((left > 0)); do
    vm_kib VmRSS "${fam[@]}"
    if ((VM_KIB > peak)); then peak=$VM_KIB; fi
    samples=$((samples + 1))
    left=0
    for c in "${curls[@]}"; do
      if running "$c"; then left=$((left + 1)); fi
    done
    ((left > 0)) || break
    if ! running "$pid"; then
      log_tail "$proxy"
      die "$proxy (pid $pid) exited during the uploads (log above)"
    fi
    sleep 0.1
  done
  t1=$(now_us)
  vm_kib VmHWM "${fam[@]}"
  hwm=$VM_KIB
  if ((hwm_reset && hwm > peak)); then peak=$hwm; fi
  for c in "${curls[@]}"; do stop "$c"; done
  stop "$pid"

  # What each curl reported, and what reached the backend.
  local ok=0 sent=0 recv codes=() line n
  for ((i = 1; i <= UPLOADS; i++)); do
    line=$(grep -m1 '^RESULT ' "$SG_WORK/curl-$proxy-$i.log" || true)
    read -r _ c n _ <<<"${line:-RESULT 000 0 0}"
    codes+=("$c")
    if [[ $c == 200 ]]; then
      ok=$((ok + 1))
      sent=$((sent + n))
    fi
  done
  recv=$(tail -c +$((from + 1)) "$backend_log" | awk '$1 == "BODY" { s += $3 } END { printf "%.0f", s }')

  R_OK[$proxy]=$ok R_IDLE[$proxy]=$idle R_PEAK[$proxy]=$peak R_SENT[$proxy]=$sent
  R_RECV[$proxy]=$recv R_WALL[$proxy]=$((t1 - t0))

  local verdict
  verdict=$(awk -v i="$idle" -v p="$peak" -v l="$LIMIT_MIB" -v ok="$ok" -v n="$UPLOADS" 'BEGIN {
    d = (p - i) / 1024
    if (ok < n) print "FAIL (" n - ok " of " n " uploads did not get a 200)"
    else if (d > l) print "FAIL (over " l " MiB)"
    else print "PASS (limit " l " MiB)"
  }')
  R_VERDICT[$proxy]=${verdict%% *}
  [[ $proxy != shardgate || $verdict == PASS* ]] || failed=1

  local summary
  summary=$(printf '%s ' "${codes[@]}" | tr ' ' '\n' | sort | uniq -c | awk '{ printf "%s%s x %s", (NR > 1 ? ", " : ""), $1, $2 }')
  awk -v px="$proxy" -v i="$idle" -v p="$peak" -v h="$hwm" -v hr="$hwm_reset" -v s="$sent" -v r="$recv" \
    -v w=$((t1 - t0)) -v ok="$ok" -v n="$UPLOADS" -v sz="$size_bytes" -v v="$verdict" \
    -v codes="$summary" -v samples="$samples" 'BEGIN {
      mib = 1048576; secs = w / 1e6
      printf "%s: %d of %d uploads got a 200 (status: %s)\n", px, ok, n, codes
      printf "  idle RSS      %8.1f MiB (after a 1 MiB warm-up upload)\n", i / 1024
      printf "  peak RSS      %8.1f MiB (VmRSS every 100 ms: %d samples; VmHWM over the uploads: %s)\n",
        p / 1024, samples, hr ? sprintf("%.1f MiB", h / 1024) : "n/a, clear_refs refused"
      printf "  peak - idle   %8.1f MiB  %s\n", (p - i) / 1024, v
      printf "  moved         %8.0f MiB sent by curl (200s), %.0f MiB received by the backend, of %.0f MiB\n",
        s / mib, r / mib, n * sz / mib
      printf "  wall time     %8.2f s\n", secs
      printf "  throughput    %8.0f MiB/s (sent by curl / wall time)\n", s / mib / secs
    }'
  echo
}

for p in "${proxies[@]}"; do
  measure "$p"
done

if ((${#proxies[@]} > 1)); then
  printf '%-10s %7s %9s %9s %10s %9s %9s %7s %6s  %s\n' proxy "200s" "idle MiB" "peak MiB" "peak-idle" \
    "MiB sent" "MiB recv" "wall s" "MiB/s" verdict
  for p in "${proxies[@]}"; do
    awk -v px="$p" -v ok="${R_OK[$p]}" -v n="$UPLOADS" -v i="${R_IDLE[$p]}" -v pk="${R_PEAK[$p]}" \
      -v s="${R_SENT[$p]}" -v r="${R_RECV[$p]}" -v w="${R_WALL[$p]}" -v v="${R_VERDICT[$p]}" 'BEGIN {
        printf "%-10s %7s %9.1f %9.1f %10.1f %9.0f %9.0f %7.2f %6.0f  %s\n", px, ok "/" n, i / 1024, pk / 1024,
          (pk - i) / 1024, s / 1048576, r / 1048576, w / 1e6, s / 1048576 / (w / 1e6), v
      }'
  done
  echo
fi
cat <<'EOF'
idle RSS: VmRSS of the proxy (nginx: master + worker summed) after the
  warm-up, before the uploads.  peak RSS: the highest of the 100 ms VmRSS
  samples and the kernel's VmHWM, reset after the idle reading.
peak - idle: what the uploads in flight cost; a gateway that streams holds
  a few buffers per upload, one that holds bodies grows by the bytes queued.
moved: bytes curl sent in the uploads that got a 200, and the bytes the
  backend read (it reads every body in full before answering).
EOF
exit "$failed"
