#!/usr/bin/env bash
# Runs every fuzz target for a fixed time (default 15 s each; pass more to
# fuzz longer, e.g. `bash scripts/fuzz.sh 600`). Installs cargo-fuzz when
# missing. The stable toolchain builds the targets with RUSTC_BOOTSTRAP=1
# (cargo fuzz passes -Z flags). A crash fails the run and leaves its input
# in fuzz/artifacts/<target>/; the seeds are in fuzz/corpus/<target>/.
# `bash scripts/fuzz.sh build` only builds them (scripts/test.sh does so
# while the tests run).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-15}
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O
if [ "$seconds" = build ]; then
  exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for target in domain config request upstream proxy_header; do
  echo "fuzzing $target for ${seconds}s"
  if ! cargo fuzz run -O "$target" -- -max_total_time="$seconds" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fuzz target $target failed: see fuzz/artifacts/$target" >&2
    exit 1
  fi
  grep -E "^Done" "$log" || true
done
