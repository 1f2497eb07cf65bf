#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine with Rust: install the tools the tests
# drive (redis-server, grpcurl, the deployment checkers, cargo-deny, cargo-fuzz, chromium with
# node and playwright-core for the console's browser test), check the
# deployment artifacts offline (scripts/check-deploy.sh) and the dependency tree's licenses,
# bans and sources (scripts/check-deny.sh), run every unit and integration test, run each fuzz
# target briefly (scripts/fuzz-smoke.sh), and end with one summary line over all of them (each
# deployment check, cargo deny check and fuzz target counts as a test).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-tools.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
deploy_rc=0
scripts/check-deploy.sh 2>&1 | tee "$log" || deploy_rc=$?
deny_rc=0
scripts/check-deny.sh 2>&1 | tee -a "$log" || deny_rc=$?
# --no-fail-fast: every test binary runs, so the summary counts every failure, not the first.
test_rc=0
cargo test --locked --no-fail-fast "$@" 2>&1 | tee -a "$log" || test_rc=$?
fuzz_rc=0
scripts/fuzz-smoke.sh 2>&1 | tee -a "$log" || fuzz_rc=$?
# A test binary that fails to build reports no "test result" line: count it as one failure.
awk -v test_rc="$test_rc" '/^(deploy|deny|fuzz): [0-9]+ passed, [0-9]+ failed$/ { p += $2; f += $4 }
     /^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { if (test_rc != 0 && f == 0) f = 1; printf "summary: %d passed, %d failed\n", p, f }' "$log"
for rc in "$deploy_rc" "$deny_rc" "$test_rc" "$fuzz_rc"; do
    [ "$rc" -eq 0 ] || exit "$rc"
done
