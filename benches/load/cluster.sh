#!/usr/bin/env bash
# Cluster mode (DESIGN §4): three shardgate nodes and one Redis on this
# machine, one nginx backend. Loopback only; stops by itself.
#
#   bash benches/load/cluster.sh              # about 3 minutes
#   SECS=5 bash benches/load/cluster.sh       # quicker
#
# 1. Admitted vs ideal: 1, 10 and 1 000 busy tenants, each over its limit,
#    their requests spread over the three nodes (one wrk per node). Ideal =
#    what one bucket per tenant admits: tenants × (TOKENS + REFILL × secs).
# 2. CPU per request, cluster node vs single node, same limits, same load
#    (1 000 tenants, under their limits so every request settles), rounds
#    alternating; and Redis commands per second against requests per
#    second in the cluster run.
# 3. p99 with 5 ms of latency in front of Redis (a delaying TCP relay)
#    against Redis direct: nothing should change, since no request waits on
#    Redis.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=benches/load/lib.sh
source "$here/lib.sh"

SECS=${SECS:-10}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-30}
TOKENS=${TOKENS:-10}
REFILL=${REFILL:-5}
SG=${SHARDGATE_BIN:-$root/target/release/shardgate}
[[ -x $SG ]] || die "no gateway at $SG (cargo build --release --bin shardgate)"
for tool in wrk nginx redis-server redis-cli python3 taskset; do
  command -v "$tool" >/dev/null || die "needs $tool (scripts/prereqs.sh; nginx-light, wrk)"
done

BACKEND=18201 REDIS=18379 SLOW_REDIS=18380
NODES=(18211 18212 18213) ADMINS=(18221 18222 18223)
lib_init
check_ports_free "$BACKEND" "$REDIS" "$SLOW_REDIS" "${NODES[@]}" "${ADMINS[@]}"

write_backend_conf "$SG_WORK/backend.conf" "$BACKEND"
spawn backend TERM taskset -c 1 nginx -p "$SG_WORK/" -c "$SG_WORK/backend.conf" -e "$SG_WORK/backend-error.log"
wait_tcp "$BACKEND" "$SPAWNED" backend
spawn redis TERM redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no
wait_tcp "$REDIS" "$SPAWNED" redis
# A relay that holds every chunk on its way to Redis for 5 ms: each
# command's round trip takes 5 ms more.
spawn slow-redis TERM python3 -c '
import asyncio, sys
async def pipe(r, w, delay):
    try:
        while data := await r.read(65536):
            if delay: await asyncio.sleep(delay)
            w.write(data); await w.drain()
    except Exception: pass
    finally: w.close()
async def serve(cr, cw):
    ur, uw = await asyncio.open_connection("127.0.0.1", int(sys.argv[2]))
    await asyncio.gather(pipe(cr, uw, 0.005), pipe(ur, cw, 0))
async def main():
    s = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]))
    await s.serve_forever()
asyncio.run(main())' "$SLOW_REDIS" "$REDIS"
wait_tcp "$SLOW_REDIS" "$SPAWNED" slow-redis

# node_conf NAME PORT ADMIN TOKENS REFILL [REDIS_PORT]: a node's config;
# without REDIS_PORT a single node (no cluster section).
node_conf() {
  local cluster=""
  [[ -n ${6:-} ]] && cluster="cluster: { redis: \"redis://127.0.0.1:$6\", node_id: $1, sync_interval_ms: 50 }"
  cat >"$SG_WORK/$1.yaml" <<EOF
server: { threads: 1, pid_file: "$SG_WORK/$1.pid", upgrade_sock: "$SG_WORK/$1.sock" }
listen: [{ addr: "127.0.0.1:$2" }]
admin: { addr: "127.0.0.1:$3" }
shards: [{ id: a, url: "http://127.0.0.1:$BACKEND" }]
domains: { fallback_suffix: .localhost }
limits:
  rate: { tokens: $4, refill_per_second: $5 }
$cluster
EOF
}

NODE_PIDS=()
# start_nodes COUNT TOKENS REFILL [REDIS_PORT]
start_nodes() {
  local i
  NODE_PIDS=()
  for ((i = 0; i < $1; i++)); do
    node_conf "gw-$((i + 1))" "${NODES[i]}" "${ADMINS[i]}" "$2" "$3" "${4:-}"
    spawn "gw-$((i + 1))" INT taskset -c 0 "$SG" -c "$SG_WORK/gw-$((i + 1)).yaml"
    NODE_PIDS+=("$SPAWNED")
    wait_http "http://127.0.0.1:${ADMINS[i]}/healthz" "$SPAWNED" "gw-$((i + 1))"
  done
  if [[ -n ${4:-} ]]; then
    local deadline=$((SECONDS + 10))
    until curl -fsS "http://127.0.0.1:${ADMINS[0]}/v1/cluster" | grep -q "\"nodes_alive\":$1"; do
      ((SECONDS < deadline)) || die "nodes did not see each other"
      sleep 0.1
    done
  fi
}

stop_nodes() {
  local p
  for p in "${NODE_PIDS[@]}"; do stop "$p"; done
  NODE_PIDS=()
}

WRK_PIDS=()
# wrk_at PORT HOSTS SUFFIX CONNS OUT: one wrk (one thread) in the background;
# wait_wrk waits for them all.
wrk_at() {
  HOSTS=$2 SUFFIX=$3 taskset -c 1 wrk -t1 -c"$4" -d"${SECS}s" --timeout 5s \
    -s "$here/report.lua" "http://127.0.0.1:$1/" >"$5" 2>&1 &
  WRK_PIDS+=($!)
}

wait_wrk() {
  wait "${WRK_PIDS[@]}"
  WRK_PIDS=()
}

field() { grep -o "$2=[0-9]*" "$1" | cut -d= -f2; }

echo "== 1. admitted vs ideal (three nodes, requests spread over them; limit $TOKENS tokens + $REFILL/s per tenant, ${SECS} s)"
printf 'tenants\trequests\tadmitted\tideal\tadmitted/ideal\n'
for hosts in 1 10 1000; do
  redis-cli -p "$REDIS" flushall >/dev/null
  start_nodes 3 "$TOKENS" "$REFILL" "$REDIS"
  for i in 0 1 2; do wrk_at "${NODES[i]}" "$hosts" ".localhost" $((CONNS / 3)) "$SG_WORK/spread-$i.out"; done
  wait_wrk
  req=0 refused=0
  for i in 0 1 2; do
    req=$((req + $(field "$SG_WORK/spread-$i.out" requests)))
    refused=$((refused + $(field "$SG_WORK/spread-$i.out" status)))
  done
  dur=$(field "$SG_WORK/spread-0.out" duration_us)
  python3 -c "
h, req, adm, secs = $hosts, $req, $req - $refused, $dur / 1e6
ideal = h * ($TOKENS + $REFILL * secs)
print(f'{h}\t{req}\t{adm}\t{ideal:.0f}\t{adm / ideal:.3f}')"
  stop_nodes
done

echo
echo "== 2. CPU per request: a cluster node vs a single node (1 000 tenants under their limits, ${SECS} s × $ROUNDS rounds)"
printf 'round\tmode\trequests\tcpu_ticks\tticks_per_1k_req\tredis_cmds_per_s\treq_per_s\n'
total_single=0 total_cluster=0 req_single=0 req_cluster=0
for ((round = 1; round <= ROUNDS; round++)); do
  for mode in single cluster; do
    redis-cli -p "$REDIS" flushall >/dev/null
    if [[ $mode == cluster ]]; then
      start_nodes 3 1000000 1000000 "$REDIS"
    else
      start_nodes 1 1000000 1000000
    fi
    before=$(cpu_ticks "${NODE_PIDS[0]}")
    cmds_before=$(redis-cli -p "$REDIS" info stats | grep -o 'total_commands_processed:[0-9]*' | cut -d: -f2)
    wrk_at "${NODES[0]}" 1000 ".localhost" "$CONNS" "$SG_WORK/cpu.out"
    wait_wrk
    ticks=$(($(cpu_ticks "${NODE_PIDS[0]}") - before))
    cmds=$(($(redis-cli -p "$REDIS" info stats | grep -o 'total_commands_processed:[0-9]*' | cut -d: -f2) - cmds_before))
    req=$(field "$SG_WORK/cpu.out" requests)
    dur=$(field "$SG_WORK/cpu.out" duration_us)
    python3 -c "print(f'$round\t$mode\t$req\t$ticks\t{$ticks * 1000 / $req:.3f}\t{$cmds / ($dur / 1e6):.0f}\t{$req / ($dur / 1e6):.0f}')"
    if [[ $mode == cluster ]]; then
      total_cluster=$((total_cluster + ticks)) req_cluster=$((req_cluster + req))
    else
      total_single=$((total_single + ticks)) req_single=$((req_single + req))
    fi
    stop_nodes
  done
done
python3 -c "
c = $total_cluster / $req_cluster; s = $total_single / $req_single
print(f'CPU per request, cluster / single: {c / s:.3f}')"

echo
echo "== 3. p99 with 5 ms in front of Redis vs Redis direct (three nodes, load on node 1, 1 000 tenants over their limits, ${SECS} s)"
printf 'redis\trequests\tp50_us\tp99_us\n'
for target in "$REDIS" "$SLOW_REDIS"; do
  redis-cli -p "$REDIS" flushall >/dev/null
  start_nodes 3 "$TOKENS" "$REFILL" "$target"
  wrk_at "${NODES[0]}" 1000 ".localhost" "$CONNS" "$SG_WORK/p99.out"
  wait_wrk
  label=direct
  [[ $target == "$SLOW_REDIS" ]] && label=+5ms
  printf '%s\t%s\t%s\t%s\n' "$label" "$(field "$SG_WORK/p99.out" requests)" \
    "$(field "$SG_WORK/p99.out" p50_us)" "$(field "$SG_WORK/p99.out" p99_us)"
  stop_nodes
done
