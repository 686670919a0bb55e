#!/usr/bin/env bash
# Installs what building and testing shardgate needs when it is missing:
# cmake (Pingora's zlib-ng), a C toolchain, iptables (the blackholed-shard
# tests), wrk (the fault tests under load), redis-server (cluster mode),
# pebble (ACME), nghttp2-client and curl (HTTP/2), chromium and
# chromium-driver (the operator's page), faketime (a node whose clock is
# off, in the cluster tests), procps (pgrep), grpcio from PyPI (a real
# gRPC server and client, tests/grpc.rs) and aioquic (an HTTP/3 client of
# another stack, tests/http3.rs). Debian/Ubuntu, as root; otherwise prints
# what to install.
set -euo pipefail
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)           # the fault tests under load
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server) # cluster-mode tests (own Redis, own Redis Cluster)
command -v pebble >/dev/null 2>&1 || missing+=(pebble)      # ACME tests: Pebble and pebble-challtestsrv
command -v h2load >/dev/null 2>&1 || missing+=(nghttp2-client) # HTTP/2 tests: h2load, nghttp
command -v curl >/dev/null 2>&1 || missing+=(curl)          # HTTP/2 tests: curl --http2
command -v chromium >/dev/null 2>&1 || missing+=(chromium)  # the operator's page in a real browser (tests/page.rs)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v ss >/dev/null 2>&1 || missing+=(iproute2)       # tests/faults.rs: a shard socket's keep-alive timer
command -v faketime >/dev/null 2>&1 || missing+=(faketime)  # tests/cluster.rs: a node with a skewed clock
command -v pgrep >/dev/null 2>&1 || missing+=(procps)        # scripts/test.sh stops the fuzz build's tree
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if [ "${#missing[@]}" -ne 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "please install: ${missing[*]} (e.g. sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi
# A real gRPC server and client for tests/grpc.rs.
if ! python3 -c "import grpc" >/dev/null 2>&1; then
  echo "installing: grpcio (PyPI)"
  python3 -m pip install --quiet grpcio \
    || python3 -m pip install --quiet --break-system-packages grpcio \
    || { echo "please install grpcio (python3 -m pip install grpcio)" >&2; exit 1; }
fi
# An HTTP/3 client of another stack than quinn's for tests/http3.rs.
if ! python3 -c "import aioquic" >/dev/null 2>&1; then
  echo "installing: aioquic (PyPI)"
  python3 -m pip install --quiet aioquic \
    || python3 -m pip install --quiet --break-system-packages aioquic \
    || { echo "please install aioquic (python3 -m pip install aioquic)" >&2; exit 1; }
fi
