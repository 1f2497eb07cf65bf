#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine with Rust: install the tools the tests
# drive (redis-server, grpcurl), then run every unit and integration test, and end with one
# summary line over all test binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-tools.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --locked "$@" 2>&1 | tee "$log"
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "summary: %d passed, %d failed\n", p, f }' "$log"
