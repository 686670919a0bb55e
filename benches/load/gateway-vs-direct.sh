#!/usr/bin/env bash
# shardgate vs the same demo shard reached directly, with wrk: requests/s,
# latency and the gateway's CPU per 1 000 requests, 1 host and 1 000 hosts.
# The gateway runs on core 0; wrk and the demo shards on core 1.
#   bash benches/load/gateway-vs-direct.sh [seconds per run]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
conns=${CONNS:-32}
command -v wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)"; exit 1; }
cargo build --release --bin shardgate --example demo_shards >/dev/null

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cat > "$work/gw.yaml" <<YAML
server: { threads: 1, pid_file: $work/gw.pid, upgrade_sock: $work/gw.sock }
listen: [{ addr: 127.0.0.1:8180 }]
admin: { addr: 127.0.0.1:9191 }
state: false
shards:
  - { id: shard-1, url: "http://127.0.0.1:3101" }
  - { id: shard-2, url: "http://127.0.0.1:3102" }
  - { id: shard-3, url: "http://127.0.0.1:3103" }
limits:
  connection_cap: 100000
  rate: { tokens: 1000000000, refill_per_second: 1000000000 }
domains: { fallback_suffix: .localhost }
YAML

taskset -c 1 target/release/examples/demo_shards 3101 3102 3103 >/dev/null &
shards=$!
RUST_LOG=error taskset -c 0 target/release/shardgate -c "$work/gw.yaml" 2>"$work/gw.log" &
gw=$!
sleep 1

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

run() { # name port hosts
  local name=$1 port=$2 hosts=$3
  local before after sb sa
  before=$(cpu_ticks "$gw")
  sb=$(cpu_ticks "$shards")
  local out
  out=$(HOSTS=$hosts taskset -c 1 wrk -t1 -c"$conns" -d"${secs}s" --latency -s benches/load/hosts.lua "http://127.0.0.1:$port/")
  after=$(cpu_ticks "$gw")
  sa=$(cpu_ticks "$shards")
  local reqs rps p50 p99
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1=="50%" {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  local cpu_ms_per_k shard_ms_per_k
  cpu_ms_per_k=$(awk -v t=$((after - before)) -v hz="$hz" -v r="$reqs" 'BEGIN { printf "%.2f", (t / hz * 1000) / (r / 1000) }')
  shard_ms_per_k=$(awk -v t=$((sa - sb)) -v hz="$hz" -v r="$reqs" 'BEGIN { printf "%.2f", (t / hz * 1000) / (r / 1000) }')
  printf '%-10s %5s hosts %9s req/s  p50 %8s  p99 %8s  CPU ms/1k req: gateway %6s, demo shard %6s\n' "$name" "$hosts" "$rps" "$p50" "$p99" "$cpu_ms_per_k" "$shard_ms_per_k"
  echo "$name $hosts $rps $cpu_ms_per_k $shard_ms_per_k" >> "$work/results"
}

for hosts in 1 1000; do
  run direct 3101 "$hosts"
  run shardgate 8180 "$hosts"
done
echo
awk '{ rps[$1" "$2]=$3; gcpu[$1" "$2]=$4; scpu[$1" "$2]=$5 } END {
  for (h = 1; h <= 1000; h *= 1000)
    printf "%4d hosts: throughput shardgate/direct %.2f; gateway CPU per request / demo shard CPU per request %.2f\n", h, rps["shardgate "h]/rps["direct "h], gcpu["shardgate "h]/scpu["direct "h]
}' "$work/results"
