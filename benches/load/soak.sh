#!/usr/bin/env bash
# Soak: one shardgate cluster node with Redis under mixed abuse for
# DURATION seconds (issue 23; DESIGN §2 "Bounded by design"). Loopback only;
# stops by itself.
#
# Set-up: four nginx backends (shards e1, e2 in region east, w1, w2 in
# west; one nginx each, so that one can be killed), a redis-server on a
# free port, and shardgate in cluster mode with a plain listener, a TLS
# listener (self-signed certificate, ALPN h2 and http/1.1), an admin
# listener with a token, a tenant rate limit (400 tokens, 200/s), a
# connection cap (256), limits.keepalive_timeout_ms = KEEPALIVE_MS, four
# real tenants in domains.map and domains.fallback_suffix .localhost.
#
# Load, all for DURATION seconds:
#   - real tenants: GETs (wrk, REAL_RATE × 3/4 req/s) and POSTs with a 1 KiB
#     body (wrk, REAL_RATE / 4) over shop, blog, api, docs (shop gets half,
#     above its refill: some 429s); status codes counted (soak.lua);
#   - invented tenants: INVENT_RATE new names per second under the fallback
#     suffix (wrk paced by soak.lua; the rate achieved is printed);
#   - SLOW silent sockets, a third each plain, TLS with ALPN http/1.1 and TLS
#     with ALPN h2 (edge_probe.py slowloris): connect, finish the handshake,
#     send nothing; each one's time until the gateway closes it is measured
#     and the socket is opened again at once (first openings spread over
#     the keep-alive timeout), so SLOW stay open the whole run;
#   - an HTTP/2 rapid-reset client (edge_probe.py rapid-reset): HEADERS +
#     RST_STREAM pairs until GOAWAY or close, then a new connection;
#   - faults: every KILL_EVERY s the next shard (e1, w1, e2, w2, ...) is
#     SIGKILLed and started again KILL_EVERY/2 s later; Redis is SIGKILLed
#     at 30 % and 65 % of the run (short runs: 20 % and 50 %) and started
#     again (empty) REDIS_DOWN s later.
# Every SAMPLE_EVERY s one line: the gateway's RSS (VmRSS), Redis
# used_memory, DBSIZE and the entries in the shared-state keys
# (`shardgate:{state}*`, region assignments among them), the admissions held
# (sum of shardgate_shard_active_connections on /metrics), tracked tenants
# and region assignments (/v1/metrics), silent sockets open.
#
# Summary and checks (exit 1 if one fails, naming it):
#   rss-flat      gateway RSS max/min after WARMUP s within FLAT_PCT (10 %)
#   redis-flat    Redis used_memory max/min after WARMUP s within FLAT_PCT (while
#                 up, and not within REDIS_SETTLE s of its restart: it comes
#                 back empty)
#   real-answered real requests: only 200 and 429 (a 503 only while all of a
#                 tenant's shards are down, which this schedule never does),
#                 no socket error or timeout
#   admissions    none held 3 s after the load stopped
#   slow-<kind>   every silent socket closed within KEEPALIVE_MS + 1 000 ms
#                 (max close time, and none still open past it at the end)
#   rapid-reset   no reset stream reached a shard (the backends count them)
#
#   DURATION=60 bash benches/load/soak.sh        # the short variant (about 75 s)
#   bash benches/load/soak.sh                    # 30 minutes
#
# Environment (defaults; "short" = DURATION < 900):
#   DURATION=1800     seconds of load
#   SLOW=5000         silent sockets (split plain / TLS HTTP/1.1 / TLS h2)
#   INVENT_RATE=2000  invented tenants per second
#   REAL_RATE=800     real requests per second (GET 3/4, POST 1/4)
#   KEEPALIVE_MS=5000 limits.keepalive_timeout_ms (and header_timeout_ms)
#   SAMPLE_EVERY=60   seconds between samples (short: 10)
#   KILL_EVERY=120    seconds between shard kills (short: DURATION/4)
#   REDIS_DOWN=60     seconds of each of the two Redis outages (short: 10)
#   WARMUP=300        seconds left out of the flatness checks (short: DURATION/5)
#   REDIS_SETTLE=60   Redis samples taken less than this long after Redis came
#                     back (empty) are left out of redis-flat (short: SAMPLE_EVERY)
#   FLAT_PCT=10       allowed spread (max - min) / min, per cent
#   THREADS=2         server.threads
#   SHARDGATE_BIN=target/release/shardgate, BUILD=0 (or --build), KEEP=0
# Ports: backends 18601-18604, shardgate 18680 (TLS 18643, admin 18690),
# Redis: a free port; all on 127.0.0.1. Needs wrk, nginx, redis-server,
# redis-cli, openssl, curl, python3 (Debian: apt-get install wrk nginx-light
# redis-server openssl curl python3).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
caller=$PWD
# shellcheck source=lib.sh
source "$here/lib.sh"
# shellcheck source=edge-lib.sh
source "$here/edge-lib.sh"
parse_args "$0" "$@"

DURATION=${DURATION:-1800}
SLOW=${SLOW:-5000}
INVENT_RATE=${INVENT_RATE:-2000}
REAL_RATE=${REAL_RATE:-800}
KEEPALIVE_MS=${KEEPALIVE_MS:-5000}
FLAT_PCT=${FLAT_PCT:-10}
THREADS=${THREADS:-2}
for v in DURATION INVENT_RATE REAL_RATE KEEPALIVE_MS THREADS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
[[ $SLOW =~ ^[0-9]+$ ]] || die "SLOW must be a non-negative integer (got '$SLOW')"
((DURATION >= 20)) || die "DURATION must be at least 20 s"
if ((DURATION >= 900)); then
  SAMPLE_EVERY=${SAMPLE_EVERY:-60} KILL_EVERY=${KILL_EVERY:-120}
  REDIS_DOWN=${REDIS_DOWN:-60} WARMUP=${WARMUP:-300} REDIS_SETTLE=${REDIS_SETTLE:-60}
else
  SAMPLE_EVERY=${SAMPLE_EVERY:-10} KILL_EVERY=${KILL_EVERY:-$((DURATION / 4))}
  REDIS_DOWN=${REDIS_DOWN:-$((DURATION / 6 < 10 ? DURATION / 6 : 10))} WARMUP=${WARMUP:-$((DURATION / 5))}
  REDIS_SETTLE=${REDIS_SETTLE:-$SAMPLE_EVERY}
fi
[[ $REDIS_SETTLE =~ ^[0-9]+$ && $WARMUP =~ ^[0-9]+$ ]] || die "REDIS_SETTLE and WARMUP must be non-negative integers"
for v in SAMPLE_EVERY KILL_EVERY REDIS_DOWN; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
for t in wrk nginx redis-server redis-cli openssl curl python3 ss pgrep; do
  command -v "$t" >/dev/null || die "$t is needed (Debian: apt-get install wrk nginx-light redis-server openssl curl python3 iproute2 procps)"
done
resolve_shardgate_bin "$root" "$caller"
cd "$root"
raise_nofile $((SLOW + 4096))

PLAIN=18680 TLS=18643 ADMIN=18690
SHARDS=(e1 e2 w1 w2)
declare -A SHARD_PORT=([e1]=18601 [e2]=18602 [w1]=18603 [w2]=18604)
declare -A SHARD_REGION=([e1]=east [e2]=east [w1]=west [w2]=west)
check_ports_free "$PLAIN" "$TLS" "$ADMIN" "${SHARD_PORT[@]}"
REDIS=$(free_port)
LIMIT_MS=$((KEEPALIVE_MS + 1000))
TOKEN=soak-token-$(date +%s)-$RANDOM$RANDOM
REAL_HOSTS=shop.example.test,shop.example.test,shop.example.test,blog.example.test,api.example.test,docs.example.test

lib_init
work=$SG_WORK
echo "soak: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "  shardgate: $SHARDGATE_BIN (built $(date -u -r "$SHARDGATE_BIN" '+%Y-%m-%d %H:%M UTC'))"
echo "  ${DURATION} s: real $REAL_RATE req/s (GET 3/4, POST 1/4), invented $INVENT_RATE tenants/s," \
  "$SLOW silent sockets, rapid reset; shard killed every $KILL_EVERY s for $((KILL_EVERY / 2)) s," \
  "Redis killed twice for $REDIS_DOWN s"
echo "  samples every $SAMPLE_EVERY s; flatness after $WARMUP s within $FLAT_PCT %; keepalive_timeout_ms $KEEPALIVE_MS (limit $LIMIT_MS ms); Redis on $REDIS"
echo

# ------------------------------------------------------------- set-up

make_cert "$work/certs" bench
printf '%s\n' "$TOKEN" >"$work/admin.token"

declare -A SHARD_PID=()
declare -A SHARD_STARTS=()
start_shard() {
  local id=$1
  SHARD_STARTS[$id]=$((${SHARD_STARTS[$id]:-0} + 1))
  spawn "shard-$id-${SHARD_STARTS[$id]}" TERM nginx -p "$work/shard-$id/" -c "$work/shard-$id/nginx.conf" \
    -e "$work/shard-$id/error.log"
  SHARD_PID[$id]=$SPAWNED
  wait_tcp "${SHARD_PORT[$id]}" "$SPAWNED" "shard-$id-${SHARD_STARTS[$id]}"
}
kill_shard() { # SIGKILL master and worker, as a crash would
  local id=$1 p
  disown "${SHARD_PID[$id]}" 2>/dev/null || true # no "Killed" notice from bash
  for p in $(family "${SHARD_PID[$id]}"); do kill -KILL "$p" 2>/dev/null || true; done
  stop "${SHARD_PID[$id]}"
  SHARD_PID[$id]=""
}
for id in "${SHARDS[@]}"; do
  write_counting_backend_conf "$work/shard-$id" "${SHARD_PORT[$id]}"
  start_shard "$id"
done

REDIS_PID="" REDIS_STARTS=0
start_redis() {
  REDIS_STARTS=$((REDIS_STARTS + 1))
  spawn "redis-$REDIS_STARTS" TERM redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no
  REDIS_PID=$SPAWNED
  wait_tcp "$REDIS" "$REDIS_PID" "redis-$REDIS_STARTS"
}
kill_redis() {
  disown "$REDIS_PID" 2>/dev/null || true
  kill -KILL "$REDIS_PID" 2>/dev/null || true
  stop "$REDIS_PID"
  REDIS_PID=""
}
start_redis

{
  cat <<EOF
server: { threads: $THREADS, pid_file: $work/shardgate.pid, upgrade_sock: $work/shardgate.sock, grace_period_seconds: 1, graceful_shutdown_timeout_seconds: 1 }
listen:
  - { addr: "127.0.0.1:$PLAIN" }
  - { addr: "127.0.0.1:$TLS", tls: true }
admin: { addr: "127.0.0.1:$ADMIN", token_file: $work/admin.token }
state: false
tls: { certs: $work/certs, default_cert: bench, alpn: [h2, http/1.1] }
shards:
EOF
  for id in "${SHARDS[@]}"; do
    printf '  - { id: %s, url: "http://127.0.0.1:%s", region: %s }\n' "$id" "${SHARD_PORT[$id]}" "${SHARD_REGION[$id]}"
  done
  cat <<EOF
regions: [{ id: east }, { id: west }]
limits:
  connection_cap: 256
  rate: { tokens: 400, refill_per_second: 200 }
  keepalive_timeout_ms: $KEEPALIVE_MS
  header_timeout_ms: $KEEPALIVE_MS
domains:
  map:
    shop.example.test: shop
    blog.example.test: blog
    api.example.test: api
    docs.example.test: docs
  fallback_suffix: .localhost
cluster: { redis: "redis://127.0.0.1:$REDIS", node_id: soak-1, sync_interval_ms: 50 }
log: { access: off }
EOF
} >"$work/shardgate.yaml"
"$SHARDGATE_BIN" -t -c "$work/shardgate.yaml" >/dev/null || die "shardgate refuses the soak configuration ($work/shardgate.yaml)"

spawn shardgate INT env RUST_LOG=error "$SHARDGATE_BIN" -c "$work/shardgate.yaml"
SG_PID=$SPAWNED
wait_tcp "$PLAIN" "$SG_PID" shardgate
wait_tcp "$TLS" "$SG_PID" shardgate
wait_http "http://127.0.0.1:$ADMIN/healthz" "$SG_PID" shardgate
AUTH=(-H "Authorization: Bearer $TOKEN")
deadline=$((SECONDS + 20))
until [[ $(curl -fsS --max-time 2 "${AUTH[@]}" "http://127.0.0.1:$ADMIN/v1/shards" 2>/dev/null | grep -o '"healthy":true' | wc -l) == 4 ]] &&
  curl -fsS --max-time 2 "${AUTH[@]}" "http://127.0.0.1:$ADMIN/v1/cluster" 2>/dev/null | grep -q '"up":true'; do
  ((SECONDS < deadline)) || die "shardgate: not every shard healthy and Redis up within 20 s"
  alive "$SG_PID" || { log_tail shardgate; die "shardgate exited"; }
  sleep 0.2
done

# ------------------------------------------------------------ sampling

samples=$work/samples.tsv
events=$work/events.tsv
printf 't\tphase\trss_kib\tredis_used\tredis_keys\tstate_entries\tadmissions\ttenants\tassignments\tredis_up_gauge\tslow_open\n' >"$samples"
: >"$events"

# admissions: the sum of shardgate_shard_active_connections ("-" if /metrics
# does not answer).
admissions() {
  local m
  m=$(curl -fsS --max-time 3 "http://127.0.0.1:$ADMIN/metrics" 2>/dev/null) || { echo -; return; }
  awk '/^shardgate_shard_active_connections[{ ]/ { s += $NF; n++ } END { if (n) printf "%d\n", s; else print "-" }' <<<"$m"
}

# Entries in the shared-state keys (`shardgate:{state}*`: the runtime state,
# region assignments and whatever else lives there), summed over hashes,
# lists, sets, sorted sets and streams: what grows if invented tenants
# leave traces in Redis outside their own `t:{tenant}` keys.
# shellcheck disable=SC2016 # Lua, not shell
STATE_ENTRIES='local n = 0
for _, k in ipairs(redis.call("keys", ARGV[1])) do
  local t = redis.call("type", k).ok
  if t == "hash" then n = n + redis.call("hlen", k)
  elseif t == "list" then n = n + redis.call("llen", k)
  elseif t == "set" then n = n + redis.call("scard", k)
  elseif t == "zset" then n = n + redis.call("zcard", k)
  elseif t == "stream" then n = n + redis.call("xlen", k) end
end
return n'

# sample T PHASE: one line to $samples and to the screen.
sample() {
  local t=$1 phase=$2 rss used=- keys=- hlen=- adm tenants=- assigned=- up=- m v1
  rss=$(status_kib VmRSS "$SG_PID")
  if [[ -n $REDIS_PID ]]; then
    used=$(redis-cli -p "$REDIS" info memory 2>/dev/null | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }')
    keys=$(redis-cli -p "$REDIS" dbsize 2>/dev/null || echo -)
    hlen=$(redis-cli -p "$REDIS" eval "$STATE_ENTRIES" 0 'shardgate:{state}*' 2>/dev/null || echo -)
  fi
  m=$(curl -fsS --max-time 3 "http://127.0.0.1:$ADMIN/metrics" 2>/dev/null || true)
  adm=$(awk '/^shardgate_shard_active_connections[{ ]/ { s += $NF; n++ } END { if (n) printf "%d\n", s; else print "-" }' <<<"$m")
  up=$(awk '/^shardgate_cluster_redis_up / { print $2 }' <<<"$m")
  v1=$(curl -fsS --max-time 3 "${AUTH[@]}" "http://127.0.0.1:$ADMIN/v1/metrics" 2>/dev/null || true)
  tenants=$(grep -o '"tenants":[0-9]*' <<<"$v1" | head -n 1 | cut -d: -f2)
  assigned=$(grep -o '"assignments":[0-9]*' <<<"$v1" | head -n 1 | cut -d: -f2)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$phase" "$rss" "${used:--}" "${keys:--}" "${hlen:--}" \
    "${adm:--}" "${tenants:--}" "${assigned:--}" "${up:--}" "$(slow_open slow)" >>"$samples"
  local redis="Redis down"
  if [[ -n $used && $used != - ]]; then
    redis=$(awk -v b="$used" -v k="$keys" -v h="$hlen" 'BEGIN { printf "Redis %.2f MiB, %s keys, %s {state} entries", b / 1048576, k, h }')
  fi
  printf '  t=%5ss  RSS %6.1f MiB  %s  admissions %s  tenants %s (assignments %s)  silent open %s%s\n' \
    "$t" "$(awk -v k="$rss" 'BEGIN { print k / 1024 }')" "$redis" \
    "${adm:--}" "${tenants:--}" "${assigned:--}" "$(slow_open slow)" "$(down_note)"
}

DOWN_SHARD=""
down_note() {
  local s=""
  [[ -n $DOWN_SHARD ]] && s+="  [shard $DOWN_SHARD down]"
  [[ -z $REDIS_PID ]] && s+="  [Redis down]"
  echo "$s"
}

event() { # T TEXT
  printf '%s\t%s\n' "$1" "$2" >>"$events"
  printf '  t=%5ss  -- %s\n' "$1" "$2"
}

# ---------------------------------------------------------------- load

T0=$EPOCHREALTIME
get_rate=$((REAL_RATE * 3 / 4))
post_rate=$((REAL_RATE - get_rate))
conns_for() { # RATE -> connections: enough for 20 ms of latency, at least 4
  local c=$(($1 / 50))
  ((c < 4)) && c=4
  echo "$c"
}
spawn wrk-real-get TERM env SOAK_HOSTS="$REAL_HOSTS" SOAK_RATE="$get_rate" SOAK_T0="$T0" \
  wrk -t1 -c"$(conns_for "$get_rate")" -d"${DURATION}s" --timeout 10s -s "$here/soak.lua" "http://127.0.0.1:$PLAIN/"
WRK_PIDS=("$SPAWNED")
spawn wrk-real-post TERM env SOAK_HOSTS="$REAL_HOSTS" SOAK_METHOD=POST SOAK_RATE="$post_rate" SOAK_T0="$T0" \
  wrk -t1 -c"$(conns_for "$post_rate")" -d"${DURATION}s" --timeout 10s -s "$here/soak.lua" "http://127.0.0.1:$PLAIN/"
WRK_PIDS+=("$SPAWNED")
spawn wrk-invented TERM env SOAK_INVENT=1 SOAK_RATE="$INVENT_RATE" SOAK_T0="$T0" \
  wrk -t1 -c"$(conns_for "$INVENT_RATE")" -d"${DURATION}s" --timeout 10s -s "$here/soak.lua" "http://127.0.0.1:$PLAIN/"
WRK_PIDS+=("$SPAWNED")
start_slowloris slow "$PLAIN" "$TLS" "$SLOW" "$DURATION" "$LIMIT_MS" "$KEEPALIVE_MS"
spawn rapid TERM python3 "$here/edge_probe.py" rapid-reset --target "127.0.0.1:$TLS" \
  --authority rapid.localhost --path /rapid-reset --duration "$DURATION"
RAPID_PID=$SPAWNED

# The schedule: shard kills at k × KILL_EVERY (down KILL_EVERY/2), Redis
# outages at 30 % and 65 % of the run (short runs: 20 % and 50 %).
if ((DURATION >= 900)); then
  R1=$((DURATION * 30 / 100)) R2=$((DURATION * 65 / 100))
else # earlier, so that samples of a settled Redis follow each outage
  R1=$((DURATION * 20 / 100)) R2=$((DURATION * 50 / 100))
fi
kill_n=0 revive_shard_at=-1 revive_redis_at=-1
sleep_until() { # seconds since T0
  local now_us target_us
  now_us=${EPOCHREALTIME/./}
  target_us=$((${T0/./} + $1 * 1000000))
  ((target_us > now_us)) && sleep "$(printf '%d.%06d' $(((target_us - now_us) / 1000000)) $(((target_us - now_us) % 1000000)))"
  return 0
}

cpu_s() { # PID... -> seconds of CPU, summed over the processes and their children
  local p t=0 q
  for p in "$@"; do
    for q in $(family "$p"); do
      if alive "$q"; then t=$((t + $(cpu_ticks "$q" 2>/dev/null || echo 0))); fi
    done
  done
  awk -v t="$t" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.0f", t / hz }'
}

for ((t = 0; t < DURATION; t++)); do
  sleep_until "$t"
  alive "$SG_PID" || { log_tail shardgate; die "shardgate exited during the soak (t=$t s)"; }
  if ((t == revive_shard_at)); then
    start_shard "$DOWN_SHARD"
    event "$t" "shard $DOWN_SHARD started again"
    DOWN_SHARD=""
  fi
  if ((t == revive_redis_at)); then
    start_redis
    event "$t" "Redis started again (empty)"
  fi
  if ((t > 0 && t % KILL_EVERY == 0 && t + KILL_EVERY / 2 < DURATION)) && [[ -z $DOWN_SHARD ]]; then
    order=(e1 w1 e2 w2)
    DOWN_SHARD=${order[kill_n % 4]}
    kill_n=$((kill_n + 1))
    kill_shard "$DOWN_SHARD"
    revive_shard_at=$((t + KILL_EVERY / 2 > t ? t + KILL_EVERY / 2 : t + 1))
    event "$t" "shard $DOWN_SHARD killed (SIGKILL)"
  fi
  if ((t == R1 || t == R2)) && [[ -n $REDIS_PID ]]; then
    kill_redis
    revive_redis_at=$((t + REDIS_DOWN))
    event "$t" "Redis killed (SIGKILL)"
  fi
  if ((t % SAMPLE_EVERY == 0)); then sample "$t" load; fi
  if ((t == DURATION - 1)); then # CPU so far, while everything still runs
    shard_pids=()
    for id in "${SHARDS[@]}"; do [[ -n ${SHARD_PID[$id]} ]] && shard_pids+=("${SHARD_PID[$id]}"); done
    event "$t" "CPU: gateway $(cpu_s "$SG_PID") s, wrk $(cpu_s "${WRK_PIDS[@]}") s, silent-socket probes $(cpu_s "${SLOW_PIDS[@]}") s, rapid-reset probe $(cpu_s "$RAPID_PID") s, backends $(cpu_s "${shard_pids[@]}") s, Redis $(cpu_s "$REDIS_PID") s (processes started again during the run: since their last start)"
  fi
done
sleep_until "$DURATION"
sample "$DURATION" load
# Faults scheduled past the end (they should not be): undo them.
[[ -n $DOWN_SHARD ]] && { start_shard "$DOWN_SHARD"; DOWN_SHARD=""; }
[[ -z $REDIS_PID ]] && start_redis

# ------------------------------------------------------------ the end

for p in "${WRK_PIDS[@]}"; do
  deadline=$((SECONDS + 30))
  while alive "$p" && ((SECONDS < deadline)); do sleep 0.2; done
done
for p in "${WRK_PIDS[@]}"; do stop "$p"; done
for i in "${!SLOW_PIDS[@]}"; do
  wait_probe "${SLOW_PIDS[i]}" "${SLOW_NAMES[i]}" 30 >>"$work/slow.json"
done
wait_probe "$RAPID_PID" rapid 30 >"$work/rapid.json"
end_s=$(((${EPOCHREALTIME/./} - ${T0/./}) / 1000000))
event "$end_s" "load stopped; waiting 3 s"
sleep 3
after_adm=$(admissions)
sample "$((end_s + 3))" after
reached=$(rapid_count "${SHARDS[@]/#/$work/shard-}")

# ------------------------------------------------------------- summary

for n in real-get real-post invented; do
  printf '%s %s\n' "$n" "$(grep '^WRK_RESULT' "$work/wrk-$n.log" | tail -n 1)"
done >"$work/wrk.txt"

echo
python3 - "$work" "$WARMUP" "$FLAT_PCT" "$KEEPALIVE_MS" "$after_adm" "$reached" "$INVENT_RATE" "$DURATION" "$REDIS_SETTLE" <<'PY'
import json
import sys

work, warmup, flat_pct, keepalive, after_adm, reached, invent_rate, duration, settle = sys.argv[1:]
warmup, flat_pct, keepalive, duration, settle = int(warmup), float(flat_pct), int(keepalive), int(duration), int(settle)
events = [l.rstrip("\n").split("\t", 1) for l in open(f"{work}/events.tsv")]
events = [(int(t), e) for t, e in events]
redis_back = [t for t, e in events if e.startswith("Redis started again")]
limit = keepalive + 1000
fails = []


def num(v):
    try:
        return float(v)
    except ValueError:
        return None


head = open(f"{work}/samples.tsv").readline().rstrip("\n").split("\t")
rows = [dict(zip(head, l.rstrip("\n").split("\t"))) for l in open(f"{work}/samples.tsv").readlines()[1:]]
late = [r for r in rows if r["phase"] == "load" and int(r["t"]) >= warmup]


def flat(name, key, scale, unit, check, skip=lambda r: False, note=""):
    vals = [num(r[key]) for r in late if not skip(r)]
    vals = [v for v in vals if v is not None]
    if len(vals) < 2:
        print(f"{name:12} too few samples after {warmup} s{note} ({len(vals)})  FAIL")
        fails.append(f"{check} (too few samples)")
        return
    lo, hi = min(vals), max(vals)
    spread = 100 * (hi - lo) / lo if lo > 0 else float("inf")
    ok = spread <= flat_pct
    print(f"{name:12} after {warmup} s: min {lo / scale:.2f} {unit}, max {hi / scale:.2f} {unit}, "
          f"spread {spread:.1f} % ({len(vals)} samples{note})  {'ok' if ok else 'FAIL'} (≤ {flat_pct:g} %)")
    if not ok:
        fails.append(f"{check} ({spread:.1f} % > {flat_pct:g} %)")


print("== memory")
flat("gateway RSS", "rss_kib", 1024, "MiB", "rss-flat")
flat("Redis memory", "redis_used", 1048576, "MiB", "redis-flat",
     skip=lambda r: any(0 <= int(r["t"]) - b < settle for b in redis_back),
     note=f"; none within {settle} s of a Redis restart")
keys = [int(r["redis_keys"]) for r in late if r["redis_keys"].isdigit()]
hl = [int(r["state_entries"]) for r in late if r["state_entries"].isdigit()]
ten = [int(r["tenants"]) for r in late if r["tenants"].isdigit()]
if keys:
    print(f"{'Redis keys':12} after {warmup} s: {min(keys)}-{max(keys)}; entries in the {{state}} keys {min(hl, default='-')}-{max(hl, default='-')}")
if ten:
    print(f"{'tenants':12} tracked by the gateway after {warmup} s: {min(ten)}-{max(ten)}")

print("\n== requests")
wrk = {}
for line in open(f"{work}/wrk.txt"):
    name, _, rest = line.strip().partition(" ")
    kv = dict(p.split("=", 1) for p in rest.split()[1:] if "=" in p)
    wrk[name] = kv
for name in ["real-get", "real-post", "invented"]:
    kv = wrk.get(name)
    if not kv:
        print(f"{name:10} no result")
        fails.append(f"{name} (wrk gave no result)")
        continue
    errs = sum(int(kv[k]) for k in ["connect", "read", "write", "timeout"])
    print(f"{name:10} {int(kv['requests']):9d} requests, {float(kv['rate']):7.1f}/s: 200 {kv['s200']}, 429 {kv['s429']}, "
          f"503 {kv['s503']}, other {kv['sother']}; socket errors {errs} "
          f"(connect {kv['connect']}, read {kv['read']}, write {kv['write']}, timeout {kv['timeout']}); "
          f"p99 {int(kv['p99_us']) / 1000:.1f} ms")
    if kv["others"] != "-":
        items = kv["others"].split(",")
        print(f"{'':10} not 200/429 (second:status x count): {','.join(items[:40])}{' …' if len(items) > 40 else ''}")
        for item in items[:10]:
            sec = int(item.split(":")[0])
            near = [f"{e} at {t} s" for t, e in events if sec - 10 <= t <= sec and not e.startswith("CPU")]
            if near:
                print(f"{'':10}   {item}: after {'; '.join(near)}")
    if name.startswith("real") and (int(kv["s503"]) or int(kv["sother"]) or errs):
        fails.append(f"real-answered ({name}: 503 {kv['s503']}, other {kv['sother']}, socket errors {errs})")
    if name == "invented":
        achieved = float(kv["rate"])
        note = "" if achieved >= 0.9 * float(invent_rate) else "  (WARNING: under 90 % of the target)"
        print(f"{'':10} invented tenants: {achieved:.0f}/s achieved of {invent_rate}/s asked{note}")
print("events:", "; ".join(f"{t} s {e}" for t, e in events if not e.startswith("CPU")))
print("CPU:", "; ".join(e[5:] for t, e in events if e.startswith("CPU")))

print("\n== admissions")
ok = after_adm == "0"
print(f"held 3 s after the load stopped: {after_adm}  {'ok' if ok else 'FAIL'}")
if not ok:
    fails.append(f"admissions ({after_adm} left)")

print(f"\n== silent sockets (from the end of the handshake, plain: the connection, to the gateway's close;"
      f" limit: keepalive_timeout_ms {keepalive} + 1000 = {limit} ms)")
names = {"plain": "plain", "tls": "TLS/1.1", "h2": "TLS/h2"}
for line in open(f"{work}/slow.json"):
    if not line.strip():
        continue
    r = json.loads(line)
    k = r["kind"]
    mx = r["close_max_ms"]
    past = r["closed_late"] + r["open_past_limit"]
    ok = r["closed"] > 0 and mx is not None and mx <= limit and r["open_past_limit"] == 0
    print(f"{names[k]:8} {r['count']} sockets, {r['opened']} opened, {r['closed']} closed by the gateway: "
          f"silent until the close p50 {r['close_p50_ms']} ms, p99 {r['close_p99_ms']} ms, max {mx} ms; "
          f"past the limit {past} ({r['closed_late']} closed late, {r['open_past_limit']} still open at the end, "
          f"oldest {r['oldest_open_ms']} ms)  {'ok' if ok else 'FAIL'}")
    if r["closed_late"]:
        print(f"{'':8} less the probe's own lag around each late close: max {r['close_max_less_lag_ms']} ms, "
              f"{r['closed_late_less_lag']} still past the limit")
    print(f"{'':8} from the TCP connection p99 {r['since_connect_p99_ms']} ms, max {r['since_connect_max_ms']} ms; "
          f"handshake p50 {r['handshake_p50_ms']} ms, p99 {r['handshake_p99_ms']} ms; probe's loop lag p99 "
          f"{r['client_lag_p99_ms']} ms, max {r['client_lag_max_ms']} ms; errors {r['errors'] or 0}")
    if (r["client_lag_p99_ms"] or 0) > 500:
        print(f"{'':8} note: the probe's own event loop ran up to {r['client_lag_max_ms']} ms late (a busy machine):"
              f" close times are timed when its selector saw them, but read them with that margin")
    if not ok:
        fails.append(f"slow-{k} (max {mx} ms, {past} past {limit} ms)")

print("\n== HTTP/2 rapid reset")
try:
    r = json.loads(open(f"{work}/rapid.json").read())
    s = r["sent_before_goaway_or_close"] or {}
    a = r["goaway_last_stream_accepted"] or {}
    print(f"{r['connections']} connections, {r['streams_sent']} reset streams sent; per connection until the client saw GOAWAY/close: "
          f"min {s.get('min')}, median {s.get('median')}, max {s.get('max')}; streams up to the GOAWAY's last stream id "
          f"(what the server took in): min {a.get('min')}, median {a.get('median')}, max {a.get('max')}; GOAWAY codes "
          f"{r['goaway_errors'] or '-'}; responses to reset streams {r['responses']}; errors {r['errors'] or 0}")
    for how, v in r["ended_by"].items():
        st, sec = v["streams"], v["seconds"]
        print(f"  ended by {how}: {v['connections']} connections, streams sent {st['min']}/{st['median']}/{st['max']}, "
              f"lasting {sec['min']}/{sec['median']}/{sec['max']} s (min/median/max)")
except (ValueError, OSError, KeyError):
    print("no result from the rapid-reset client")
    fails.append("rapid-reset (no result)")
ok = reached == "0"
print(f"reset streams that reached a shard: {reached}  {'ok' if ok else 'FAIL'}")
if not ok:
    fails.append(f"rapid-reset ({reached} reset streams reached a shard)")

print()
if fails:
    print("FAIL: " + "; ".join(fails))
    sys.exit(1)
print("PASS: every check")
PY
