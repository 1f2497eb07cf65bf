#!/usr/bin/env bash
# Fuzz smoke run (docs/fuzzing.md): builds the fuzz targets in fuzz/ with cargo-fuzz and runs
# each for FUZZ_SECONDS (default 40) seconds from its committed seeds (fuzz/seeds/<target>)
# plus the working corpus (fuzz/corpus/<target>, not committed; new inputs go there). One line per target, then `fuzz: N passed, M failed` last, which
# scripts/test.sh adds to its summary. A crash leaves its input in fuzz/artifacts/<target>/.
#
#   scripts/fuzz-smoke.sh                  every target, 40 s each, two at a time on two CPUs
#   FUZZ_SECONDS=600 scripts/fuzz-smoke.sh request json    a long run of two targets
#   FUZZ_BUILD_ONLY=1 scripts/fuzz-smoke.sh  only build them (scripts/test.sh, ahead of time)
#   FUZZ_JOBS=1 scripts/fuzz-smoke.sh        one target at a time (default: one per CPU)
#
# The build goes to $CARGO_TARGET_DIR/fuzz (or target/fuzz; with FUZZ_SANITIZER, fuzz-<name>):
# its flags differ from the normal build's, and sharing a directory would make each rebuild
# the other.
set -uo pipefail
cd "$(dirname "$0")/.."

# 40 s: the build is at opt-level 1 (fuzz/Cargo.toml), with 30-45 % fewer executions per
# second than opt-level 3, so 40 s gives each target at least the executions 20 s gave there.
seconds=${FUZZ_SECONDS:-40}
sanitizer=${FUZZ_SANITIZER:-none}
target_dir="${CARGO_TARGET_DIR:-$PWD/target}/fuzz"
# Another sanitizer changes every crate's flags: its own directory keeps the default build.
[ "$sanitizer" = none ] || target_dir="$target_dir-$sanitizer"
if [ "$#" -gt 0 ]; then targets=("$@"); else targets=(config request json bucket_key); fi
# No sanitizer: floodgate forbids unsafe code, so what the targets hunt is panics, arithmetic
# overflow (debug assertions are on), hangs and memory blow-ups, which need none; ASan would
# halve the executions per second. Pass FUZZ_SANITIZER=address to check dependencies' unsafe.
# cargo-fuzz comes from .tools/bin (scripts/install-test-tools.sh).
export PATH="$PWD/.tools/bin:$PATH"
# cargo-fuzz builds every crate with full debug info (`profile.release.debug=true`); line
# tables are all a crash report needs (its stack frames keep file and line), for a smaller
# build: rustc takes the last of two -C flags, and RUSTFLAGS come last.
export RUSTFLAGS="-Cdebuginfo=line-tables-only${RUSTFLAGS:+ $RUSTFLAGS}"
# Without a sanitizer every flag cargo-fuzz passes (coverage instrumentation, `--cfg fuzzing`,
# debug assertions) is a stable rustc flag: the toolchain that builds floodgate builds the
# targets too, and nothing more is downloaded. A sanitizer is a nightly-only flag (-Z).
fuzz=(cargo fuzz)
if [ "$sanitizer" != none ]; then
    if ! cargo +nightly --version >/dev/null 2>&1; then
        echo "fuzz: FUZZ_SANITIZER=$sanitizer needs a nightly toolchain:" \
            "rustup toolchain install nightly --profile minimal" >&2
        exit 1
    fi
    fuzz=(cargo +nightly fuzz)
fi
# 16 codegen units instead of cargo-fuzz's 1: floodgate, the largest crate and the last to
# compile before the four links, is then optimised on both cores instead of one, and every
# crate's optimisation works on smaller units. The executions per second stay close, without
# LTO across the units too (`lto = "off"` in fuzz/Cargo.toml; docs/fuzzing.md#build-cost has
# the figures).
flags=(--sanitizer "$sanitizer" --target-dir "$target_dir" --codegen-units 16)

passed=0
failed=0
report() { # result target detail
    echo "fuzz: $2: $1 ($3)"
    if [ "$1" = ok ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}

started=$SECONDS
# Every target at once: they share all their code, and `fuzz run` then finds them built.
if ! "${fuzz[@]}" build "${flags[@]}" >&2; then
    for target in "${targets[@]}"; do report FAILED "$target" "build failed"; done
    echo "fuzz: $passed passed, $failed failed"
    exit 1
fi
echo "fuzz: build took $((SECONDS - started)) s"
[ -z "${FUZZ_BUILD_ONLY:-}" ] || exit 0

# The targets run FUZZ_JOBS at a time (default: one per CPU): each libFuzzer run is one
# process on one core, so on two cores two runs take the time of one, and each still gets a
# core of its own for its FUZZ_SECONDS (the same executions as one at a time).
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
run() { # target: one run, its output in $logs/<target>, its exit status in $logs/<target>.rc
    local target=$1 dict=() corpora=("fuzz/corpus/$1")
    mkdir -p "fuzz/corpus/$target"
    [ -f "fuzz/dicts/$target.dict" ] && dict=("-dict=fuzz/dicts/$target.dict")
    [ -d "fuzz/seeds/$target" ] && corpora+=("fuzz/seeds/$target")
    # -timeout: an input taking 10 s is a hang; libFuzzer's default waits 20 minutes.
    "${fuzz[@]}" run "${flags[@]}" "$target" "${corpora[@]}" -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 "${dict[@]}" \
        >"$logs/$target" 2>&1
    echo $? >"$logs/$target.rc"
}
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
    batch=("${targets[@]:i:jobs}")
    for target in "${batch[@]}"; do run "$target" & done
    wait
    for target in "${batch[@]}"; do
        log=$logs/$target
        if [ "$(cat "$log.rc")" = 0 ]; then
            stat() { sed -n "s/^stat::$1: *//p" "$log"; }
            # libFuzzer's own count of the inputs it keeps (the directory also holds older ones).
            corpus=$(grep -o 'corp: [0-9]*/[0-9]*[A-Za-z]*' "$log" | tail -n 1)
            report ok "$target" "${seconds} s, $(stat number_of_executed_units) executions, \
$(stat average_exec_per_sec)/s, ${corpus:-corp: ?}, peak RSS $(stat peak_rss_mb) MB"
        else
            tail -n 40 "$log" >&2
            artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
            report FAILED "$target" "${artifact:-see the output above}"
        fi
    done
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
