#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine with Rust: install the tools the tests
# drive (redis-server, grpcurl, the deployment checkers, cargo-deny, cargo-fuzz, chromium with
# node and playwright-core for the console's browser test), check the
# deployment artifacts offline (scripts/check-deploy.sh) and the dependency tree's licenses,
# bans and sources (scripts/check-deny.sh), run every unit and integration test, run each fuzz
# target briefly (scripts/fuzz-smoke.sh), and end with one summary line over all of them (each
# deployment check, cargo deny check and fuzz target counts as a test).
#
# Two cores go a long way when nothing waits: the test build starts at once, the fuzz build
# (the longest compile) as soon as cargo-fuzz is there, a few seconds in, and the other tools
# are installed (downloads) while both compile. The fuzz build runs at the lowest CPU priority
# (nice 19), on whatever CPU the test build and the tests leave idle. Each part's output is
# printed in the usual order, and the tests' run still gets the CPU first.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
build_log=$(mktemp)
fuzz_build_log=$(mktemp)
build_pid=
fuzz_build_pid=
# A failed step ends the script: the background builds end with it.
trap 'kill $build_pid $fuzz_build_pid 2>/dev/null || true; rm -f "$log" "$build_log" "$fuzz_build_log"' EXIT
# Needs nothing that install-test-tools.sh installs; `cargo test` below finds it built (or,
# after a failed build, builds again and prints the errors).
cargo test --locked --no-run "$@" >"$build_log" 2>&1 &
build_pid=$!
scripts/install-test-tools.sh fuzz
FUZZ_BUILD_ONLY=1 nice -n 19 scripts/fuzz-smoke.sh >"$fuzz_build_log" 2>&1 &
fuzz_build_pid=$!
scripts/install-test-tools.sh
deploy_rc=0
scripts/check-deploy.sh 2>&1 | tee "$log" || deploy_rc=$?
deny_rc=0
scripts/check-deny.sh 2>&1 | tee -a "$log" || deny_rc=$?
wait "$build_pid" || true
build_pid=
cat "$build_log" >&2
# --no-fail-fast: every test binary runs, so the summary counts every failure, not the first.
test_rc=0
cargo test --locked --no-fail-fast "$@" 2>&1 | tee -a "$log" || test_rc=$?
# `fuzz-smoke.sh` finds the targets built (or builds them again and reports the failure).
wait "$fuzz_build_pid" || true
fuzz_build_pid=
cat "$fuzz_build_log" >&2
fuzz_rc=0
scripts/fuzz-smoke.sh 2>&1 | tee -a "$log" || fuzz_rc=$?
# A test binary that fails to build reports no "test result" line: count it as one failure.
awk -v test_rc="$test_rc" '/^(deploy|deny|fuzz): [0-9]+ passed, [0-9]+ failed$/ { p += $2; f += $4 }
     /^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { if (test_rc != 0 && f == 0) f = 1; printf "summary: %d passed, %d failed\n", p, f }' "$log"
for rc in "$deploy_rc" "$deny_rc" "$test_rc" "$fuzz_rc"; do
    [ "$rc" -eq 0 ] || exit "$rc"
done
