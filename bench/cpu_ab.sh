#!/usr/bin/env bash
# CPU per request of two (or more) floodgate binaries, alternating, on the bench's load: for
# comparing a change on a machine that is not quiet, where req/s means little but the CPU time
# a server spends per request (user + sys, /proc/<pid>/stat, over a fixed number of requests)
# still compares within one run.
#
#   bench/cpu_ab.sh OLD_BIN NEW_BIN                 # Redis, 1 and 4 descriptors
#   AB_ROUNDS=5 AB_REQUESTS=100000 AB_ROWS="none one four" bench/cpu_ab.sh A B C
#   AB_ARGS="--redis-timeout-ms 1000" bench/cpu_ab.sh A B   # a loaded machine: no misses
#   AB_SYSCALLS=1 AB_ROUNDS=1 AB_ROWS="none one four" bench/cpu_ab.sh A B  # syscalls per OK
#
# Rows (AB_ROWS): none (no store: an unknown domain), memory (the in-process store, no
# --redis-url, 1 descriptor), one and four (Redis, 1 and 4 descriptors, 10^6 per second
# each, as bench/side_by_side.sh). Each round runs every binary
# once per row, in turn (a fresh server and a flushed Redis each time), so load that drifts
# during the run touches every binary alike. Prints one line per run, then per row and
# binary the median CPU µs/req and the total of answers that were not OK (floodgate's own
# count plus h2load's failures): a binary that errs is not cheaper, it is broken.
# Leases are off (FLOODGATE_LEASE_FRACTION=0, unless set): the bench's load is one hot bucket
# per descriptor, which leases would answer mostly without Redis, and these rows measure the
# per-request Redis path. A binary from before leases ignores the variable.
#
# AB_SYSCALLS=1: each run's timed requests are traced instead (`perf trace -p`, every thread),
# and the run prints its syscalls per OK answer by name, the Redis sockets' (the server's
# connections to the bench's redis-server, found with `ss`) apart from the rest, and reads
# that found nothing (EAGAIN) apart; syscall counts do not depend on the machine's load as
# CPU time does, though tracing slows the server and so changes how many requests share one.
# Needs perf with syscall tracepoints (root); the CPU column is then the traced run's.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
[ $# -ge 1 ] || { sed -n '2,15p' "$0"; exit 2; }
BINS=("$@")
ROUNDS=${AB_ROUNDS:-3}
REQUESTS=${AB_REQUESTS:-50000}
WARMUP=${AB_WARMUP:-10000}
read -r -a ROWS <<<"${AB_ROWS:-one four}"
# Extra `floodgate serve` arguments, e.g. a longer Redis deadline where the machine is so
# loaded that the default 10 ms is missed (an error answer costs less than an OK one).
read -r -a EXTRA <<<"${AB_ARGS:-}"

ab_setup
TICKS=$(getconf CLK_TCK)
TRACE=$(mktemp -d)
trap 'cleanup; rm -rf "$TRACE"' EXIT

# syscalls_per_ok TRACE OK "REDIS_FDS" LABEL : one run's syscalls per OK answer (perf trace's
# output), the Redis sockets' (fds in REDIS_FDS) and the reads that found nothing apart.
syscalls_per_ok() {
    python3 - "$@" <<'PY'
import collections, re, sys
path, ok, redis_fds, label = sys.argv[1], int(sys.argv[2]), set(sys.argv[3].split()), sys.argv[4]
io = {"read", "write", "readv", "writev", "recvfrom", "sendto", "recvmsg", "sendmsg"}
counts = collections.Counter()
for line in open(path, errors="replace"):
    m = re.search(r" (\w+)\((.*)\)\s+= (.*)$", line)
    if not m:
        continue
    name, args, ret = m.groups()
    fd = re.match(r"fd: (\d+)", args)
    if name in io and fd:
        name += " (Redis)" if fd.group(1) in redis_fds else ""
    if "EAGAIN" in ret:
        name += " EAGAIN"
    counts[name] += 1
rows = sorted(counts.items(), key=lambda kv: -kv[1])
print(f"{label}: {ok} OK answers; per OK answer: "
      + ", ".join(f"{name} {n / max(ok, 1):.3f}" for name, n in rows if n / max(ok, 1) >= 0.001)
      + f"; all {sum(counts.values()) / max(ok, 1):.3f}")
PY
}

# run BIN ROW : prints "cpu_us_per_request not_ok" for one fresh server.
run() {
    local bin=$1 row=$2 pid http
    ab_start "$bin" "$row" "$WORK/server.log" "${EXTRA[@]}"
    pid=$AB_PID http=$AB_HTTP
    ab_h2 16 8 -n "$WARMUP" >/dev/null 2>&1
    local t0 t1 tracer ok0
    if [ -n "${AB_SYSCALLS:-}" ]; then
        ok0=$(ok_answers "$http")
        # Not under $WORK: the server watches its config directory's parent.
        perf trace -p "$pid" -o "$TRACE/trace.txt" 2>/dev/null &
        tracer=$!
        # perf attaches asynchronously: wait (at most 5 s) for its first line.
        for _ in $(seq 50); do
            [ -s "$TRACE/trace.txt" ] && break
            curl -s "127.0.0.1:$http/healthcheck" >/dev/null; sleep 0.1
        done
    fi
    t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    ab_h2 16 8 -n "$REQUESTS" >"$WORK/h2.out" 2>&1
    t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    if [ -n "${AB_SYSCALLS:-}" ]; then
        kill -INT "$tracer"; wait "$tracer" || true
        local redis_fds
        # No Redis connection on the none and memory rows: grep finds nothing there.
        redis_fds=$(ss -tnpH "dport = :$REDIS_PORT" | { grep -o "pid=$pid,fd=[0-9]*" || true; } |
            sed 's/.*fd=//' | tr '\n' ' ')
        syscalls_per_ok "$TRACE/trace.txt" $(($(ok_answers "$http") - ok0)) "$redis_fds" \
            "$row $bin" >> "$WORK/syscalls"
    fi
    local not_ok
    not_ok=$(not_ok_answers "$http")
    kill "$pid"; wait "$pid" 2>/dev/null || true
    local failed
    failed=$(h2_failed "$WORK/h2.out")
    # Warm-up included in the error count: an error anywhere is an error.
    echo "$(python3 -c "print(f'{1e6 * ($t1 - $t0) / $TICKS / $REQUESTS:.2f}')") $((not_ok + failed))"
}

echo "| round | row | binary | CPU µs/req | not OK |"
echo "|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
    for row in "${ROWS[@]}"; do
        for i in "${!BINS[@]}"; do
            read -r cpu bad < <(run "${BINS[$i]}" "$row")
            echo "| $round | $row | $i | $cpu | $bad |"
            echo "$row $i $cpu $bad" >> "$WORK/results"
        done
    done
done
echo
ab_summary "$WORK/results" "CPU µs/req" 2 "${BINS[@]}"
if [ -n "${AB_SYSCALLS:-}" ]; then
    echo
    echo "Syscalls per OK answer (perf trace, the timed requests of each run):"
    cat "$WORK/syscalls"
fi
echo
echo "machine: $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average: $(cut -d' ' -f1-3 /proc/loadavg), FLOODGATE_LEASE_FRACTION=$FLOODGATE_LEASE_FRACTION"
