#!/usr/bin/env bash
# The test command: prerequisites if missing, every test, then each fuzz
# target for a short fixed time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prereqs.sh
cargo test --locked "$@"
# Every fuzz target briefly (FUZZ_SECONDS=0 skips; longer: scripts/fuzz.sh 600).
if [ "${FUZZ_SECONDS:-15}" != 0 ]; then
  bash scripts/fuzz.sh "${FUZZ_SECONDS:-15}"
fi
