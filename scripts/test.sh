#!/usr/bin/env bash
# The test command: prerequisites if missing, then every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prereqs.sh
exec cargo test --locked "$@"
