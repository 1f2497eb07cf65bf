#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine with Rust: install the tools the tests
# drive (redis-server, grpcurl), then run every unit and integration test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-tools.sh
cargo test --locked "$@"
