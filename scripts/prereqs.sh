#!/usr/bin/env bash
# Installs what building and testing shardgate needs when it is missing:
# cmake (Pingora's zlib-ng), a C toolchain, iptables (the blackholed-shard
# tests), wrk (the fault tests under load) and redis-server (cluster mode). Debian/Ubuntu, as root;
# otherwise prints what to install.
set -euo pipefail
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)           # the fault tests under load
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server) # cluster-mode tests (own Redis, own Redis Cluster)
[ "${#missing[@]}" -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "please install: ${missing[*]} (e.g. sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
