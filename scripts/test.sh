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
cargo test --locked "$@"
# The gateway suites once more with the fast path off: Pingora's path must
# hold to the same tests for the requests the fast path usually takes.
SHARDGATE_TEST_FAST_PATH=off cargo test --locked --test gateway --test hostile \
  --test framing --test operations --test faults --test hooks --test embed \
  --test conformance --test tls --test bodies --test observability --test tracing \
  --test proxy_protocol --test per_client --test compression "$@"
# Every fuzz target briefly (FUZZ_SECONDS=0 skips; longer: scripts/fuzz.sh 600).
if [ "${FUZZ_SECONDS:-15}" != 0 ]; then
  bash scripts/fuzz.sh "${FUZZ_SECONDS:-15}"
fi
