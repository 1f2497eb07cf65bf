#!/usr/bin/env bash
# Instructions per request of two (or more) floodgate binaries, on the bench's load, counted
# by valgrind's callgrind: a deterministic A/B where CPU time is not. Instruction counts
# barely move with the machine's load, so a 2-5 % change resolves where `bench/cpu_ab.sh`
# (CPU time, ±20-30 % per run on a loaded VM) cannot.
#
#   bench/ir_ab.sh OLD_BIN NEW_BIN                    # Redis, 1 and 4 descriptors
#   IR_ROWS="none one four" IR_ROUNDS=2 bench/ir_ab.sh A B
#   IR_TOP=25 bench/ir_ab.sh BIN                      # plus each run's top inclusive functions
#   IR_KEEP=/tmp/cg bench/ir_ab.sh BIN                # keep callgrind's files (callgrind_annotate)
#   IR_CACHE=1 bench/ir_ab.sh OLD_BIN NEW_BIN         # plus simulated cache misses per OK answer
#   IR_ROWS="none memory" bench/ir_ab.sh target/production/examples/floor BIN  # over the floor
#
# Each run starts one server under callgrind with instrumentation off (`--instr-atstart=no`),
# sends IR_WARMUP requests, switches counting on (`callgrind_control -i on`), sends
# IR_REQUESTS requests, switches it off, and divides the instructions executed (Ir, every
# thread) by the OK answers the server counted in between. Rows (IR_ROWS) and their load are
# bench/cpu_ab.sh's: none (no store: an unknown domain), memory (the in-process store), one
# and four (Redis, 1 and 4 descriptors, 10^6 per second each, nothing ever over limit).
# Leases are off (FLOODGATE_LEASE_FRACTION=0) and the Redis deadline is 1 s
# (`--redis-timeout-ms 1000`, IR_ARGS adds more): under valgrind the server runs some 50×
# slower, and a call past the default 10 ms deadline would be an error answer, which costs
# less than an OK one. Prints one line per run (Ir per OK answer, answers not OK), then per
# row and binary the median. Any answer not OK marks the run: a binary that errs is broken,
# not cheaper. A binary named `floor` is the floor (examples/floor.rs, started with its own
# flags: `--statuses bare` on the no-store row), on the memory and no-store rows (it has no
# store); bench/cpu_ab.sh and bench/allocs.sh take it alike.
#
# IR_CACHE=1 runs callgrind's cache simulation too (`--cache-sim=yes`: a first-level data
# cache (D1) and a last-level cache (LL) shaped like the host's; every data access of the
# server's user space) and prints beside Ir the D1 and LL data misses (reads + writes) per
# OK answer: what a request's state costs when it has gone cold while the request waited
# (its futures, its plan, its h2 stream re-read when the reply comes). Simulated misses,
# like Ir, hardly move with the machine's load. The simulation slows callgrind further.
#
# Caveats: Ir counts user-space instructions only, not the kernel's time in syscalls, branch
# mispredictions or stalls; the simulated caches are one cache that every thread shares (as
# callgrind runs the threads one at a time) and see no kernel or other process; and under
# valgrind the server is slow, so more requests are ready per pass than at full speed, which
# changes how many requests share a wake-up, a read and a write. A change that saves
# instructions or (simulated) misses on the request path shows; one that saves syscalls or
# waits does not. Confirm a kept change with bench/cpu_ab.sh too.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
command -v valgrind >/dev/null && command -v callgrind_control >/dev/null ||
    { echo "needs valgrind (callgrind, callgrind_control)" >&2; exit 2; }
[ $# -ge 1 ] || { sed -n '2,34p' "$0"; exit 2; }
BINS=("$@")
ROUNDS=${IR_ROUNDS:-2}
REQUESTS=${IR_REQUESTS:-5000}
WARMUP=${IR_WARMUP:-2000}
read -r -a ROWS <<<"${IR_ROWS:-one four}"
TOP=${IR_TOP:-0}
CACHE=${IR_CACHE:-0}
CACHE_ARGS=()
[ "$CACHE" = 1 ] && CACHE_ARGS=(--cache-sim=yes)
# h2load's load: IR_CLIENTS connections, IR_STREAMS requests in flight on each (the bench's
# 16 × 8 by default).
CLIENTS=${IR_CLIENTS:-16}
STREAMS=${IR_STREAMS:-8}
read -r -a EXTRA <<<"--redis-timeout-ms 1000 ${IR_ARGS:-}"

ab_setup

# run BIN ROW LABEL : prints "ir_per_ok not_ok ir_total ok d1_per_ok ll_per_ok" for one fresh
# server (the last two "-" without IR_CACHE=1).
run() {
    local bin=$1 row=$2 label=$3 http pid
    local out="$WORK/callgrind.$label"
    AB_PREFIX=(valgrind --tool=callgrind --instr-atstart=no "${CACHE_ARGS[@]}"
               --callgrind-out-file="$out")
    ab_start "$bin" "$row" "$WORK/server.$label.log" "${EXTRA[@]}"
    pid=$AB_PID http=$AB_HTTP
    ab_h2 "$CLIENTS" "$STREAMS" -n "$WARMUP" >"$WORK/h2.warm" 2>&1
    local ok0 ok1
    ok0=$(ok_answers "$http")
    callgrind_control -i on "$pid" >/dev/null 2>&1 ||
        { echo "callgrind_control -i on failed" >&2; exit 1; }
    ab_h2 "$CLIENTS" "$STREAMS" -n "$REQUESTS" >"$WORK/h2.out" 2>&1
    callgrind_control -i off "$pid" >/dev/null 2>&1 ||
        { echo "callgrind_control -i off failed" >&2; exit 1; }
    ok1=$(ok_answers "$http")
    local not_ok
    not_ok=$(not_ok_answers "$http")
    # Nothing is counted after `-i off`: the shutdown adds no instructions to the total.
    kill "$pid"; wait "$pid" 2>/dev/null || true
    local failed
    failed=$(h2_failed "$WORK/h2.warm" "$WORK/h2.out")
    local ir d1 ll
    # The totals line lists the events in the order of the `events:` line (Ir first; with the
    # cache simulation Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw).
    read -r ir d1 ll < <(awk '
        /^events:/ { for (i = 2; i <= NF; i++) name[i] = $i }
        /^totals:/ {
            for (i = 2; i <= NF; i++) v[name[i]] = $i
            if ("D1mr" in v) print v["Ir"], v["D1mr"] + v["D1mw"], v["DLmr"] + v["DLmw"]
            else print v["Ir"], "-", "-"
            exit
        }' "$out")
    local ok=$((ok1 - ok0))
    [ "$ok" -gt 0 ] || { echo "no OK answers in the counted window" >&2; exit 1; }
    local d1_per=- ll_per=-
    if [ "$d1" != - ]; then
        d1_per=$(python3 -c "print(f'{$d1 / $ok:.0f}')")
        ll_per=$(python3 -c "print(f'{$ll / $ok:.1f}')")
    fi
    if [ "$TOP" -gt 0 ]; then
        {
            echo "== top $TOP inclusive: row $row, $bin =="
            callgrind_annotate --inclusive=yes "$out" 2>/dev/null | awk -v top="$TOP" '
                /file:function/ { list = 1; skip = 1; next }
                list && skip { skip = 0; next }
                list && n < top { print; n++ }'
        } >>"$WORK/top"
    fi
    [ -n "${IR_KEEP:-}" ] && mkdir -p "$IR_KEEP" && cp "$out" "$IR_KEEP/"
    echo "$(python3 -c "print(f'{$ir / $ok:.0f}')") $((not_ok + failed)) $ir $ok $d1_per $ll_per"
}

if [ "$CACHE" = 1 ]; then
    echo "| round | row | binary | Ir per OK answer | not OK | Ir | OK answers | D1 misses per OK | LL misses per OK |"
    echo "|---|---|---|---|---|---|---|---|---|"
else
    echo "| round | row | binary | Ir per OK answer | not OK | Ir | OK answers |"
    echo "|---|---|---|---|---|---|---|"
fi
for round in $(seq "$ROUNDS"); do
    for row in "${ROWS[@]}"; do
        for i in "${!BINS[@]}"; do
            read -r per bad ir ok d1 ll < <(run "${BINS[$i]}" "$row" "$round.$row.$i")
            if [ "$CACHE" = 1 ]; then
                echo "| $round | $row | $i | $per | $bad | $ir | $ok | $d1 | $ll |"
                echo "$row $i $d1 $bad" >>"$WORK/results.d1"
                echo "$row $i $ll $bad" >>"$WORK/results.ll"
            else
                echo "| $round | $row | $i | $per | $bad | $ir | $ok |"
            fi
            echo "$row $i $per $bad" >>"$WORK/results"
        done
    done
done
echo
ab_summary "$WORK/results" "Ir per OK answer" 0 "${BINS[@]}"
if [ "$CACHE" = 1 ]; then
    echo
    ab_summary "$WORK/results.d1" "D1 misses per OK answer" 0 "${BINS[@]}"
    echo
    ab_summary "$WORK/results.ll" "LL misses per OK answer" 1 "${BINS[@]}"
fi
[ -f "$WORK/top" ] && { echo; cat "$WORK/top"; }
echo
SIM=""
[ "$CACHE" = 1 ] && SIM=" with its cache simulation"
echo "machine: $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), valgrind $(valgrind --version)$SIM, h2load $CLIENTS × $STREAMS, $REQUESTS requests counted after $WARMUP, FLOODGATE_LEASE_FRACTION=$FLOODGATE_LEASE_FRACTION"
