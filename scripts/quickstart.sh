#!/usr/bin/env bash
# The quickstart: prerequisites if missing, then three demo shards and the
# gateway on http://127.0.0.1:8080 (try: curl http://acme.localhost:8080/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prereqs.sh
exec cargo run --release --example quickstart
