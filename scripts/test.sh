#!/usr/bin/env bash
# The test command: prerequisites if missing, clippy, every test, then each
# fuzz target for a short fixed time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prereqs.sh
# Lints first: a warning fails the run, as it would in review.
cargo clippy --locked --all-targets -- -D warnings
# Every import points down the layers, none in a circle (issue 36).
python3 scripts/imports.py
cargo test --locked --no-run "$@"
# The fuzz targets build (their own sanitized build of everything, minutes
# of CPU) while the tests run, at the lowest priority: the tests mostly
# wait on sockets and leave the cores idle. (FUZZ_SECONDS=0 skips fuzzing;
# longer: scripts/fuzz.sh 600.) It is a child of this script, in its
# process group: what stops the script's group stops it too.
fuzz_seconds=${FUZZ_SECONDS:-15}
# A process and everything it started (a failing test stops the build).
kill_tree() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
if [ "$fuzz_seconds" != 0 ]; then
  fuzz_log=$(mktemp)
  nice -n 19 bash scripts/fuzz.sh build >"$fuzz_log" 2>&1 &
  fuzz_build=$!
  trap 'kill_tree "$fuzz_build"; rm -f "$fuzz_log"' EXIT
fi
cargo test --locked "$@"
# The gateway suites once more with the fast path off: Pingora's path must
# hold to the same tests for the requests the fast path usually takes.
# (Not tests/http3.rs: HTTP/3 has no Pingora path.)
SHARDGATE_TEST_FAST_PATH=off cargo test --locked --test gateway --test hostile \
  --test framing --test operations --test faults --test hooks --test embed \
  --test conformance --test tls --test bodies --test observability --test tracing \
  --test proxy_protocol --test per_client --test compression --test grpc --test h2_shards "$@"
if [ "$fuzz_seconds" != 0 ]; then
  built=0
  wait "$fuzz_build" || built=$?
  trap - EXIT
  if [ "$built" != 0 ]; then
    tail -n 60 "$fuzz_log" >&2
    rm -f "$fuzz_log"
    echo "the fuzz targets did not build" >&2
    exit 1
  fi
  rm -f "$fuzz_log"
  bash scripts/fuzz.sh "$fuzz_seconds"
fi
