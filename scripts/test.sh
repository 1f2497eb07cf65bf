#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine with Rust: install the tools the tests
# drive (redis-server, grpcurl, the deployment checkers), check the deployment artifacts
# offline (scripts/check-deploy.sh), run every unit and integration test, run each fuzz target
# briefly (scripts/fuzz-smoke.sh), and end with one summary line over all of them (each
# deployment check and each fuzz target counts as a test).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-tools.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
deploy_rc=0
scripts/check-deploy.sh 2>&1 | tee "$log" || deploy_rc=$?
cargo test --locked "$@" 2>&1 | tee -a "$log"
fuzz_rc=0
scripts/fuzz-smoke.sh 2>&1 | tee -a "$log" || fuzz_rc=$?
awk '/^(deploy|fuzz): [0-9]+ passed, [0-9]+ failed$/ { p += $2; f += $4 }
     /^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "summary: %d passed, %d failed\n", p, f }' "$log"
[ "$deploy_rc" -eq 0 ] || exit "$deploy_rc"
exit "$fuzz_rc"
