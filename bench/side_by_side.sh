#!/usr/bin/env bash
# floodgate beside Limitador (../shared/peers/limitador-server.gz, or LIMITADOR_BIN): one
# table, each row the same h2load load on both servers, fresh server per row.
#
#   bench/side_by_side.sh                      # run by bench/run.sh; also on its own
#   SBS_SECONDS=5 SBS_REPEAT=3 bench/side_by_side.sh
#   BENCH_BIN=/path/floodgate bench/side_by_side.sh
#
# Rows: no store (an unknown domain / namespace), memory with 1 descriptor, Redis with 1 and 4
# descriptors (same redis-server, flushed between rows). Load: h2load, 16 connections × 8
# streams, one thread; a warm-up of WARMUP_REQUESTS requests first, then SBS_SECONDS of load,
# SBS_REPEAT times per row (each a fresh server) to show the spread.
#   - CPU µs/req: the server's user and system time (/proc/<pid>/stat) over the timed run only,
#     per request h2load completed.
#   - Syscalls per request: a separate run of STRACE_REQUESTS requests (after a warm-up) under
#     `strace -f -c`; strace slows the server, so these are counts, never timed, and what
#     happens per unit of time rather than per request (a timer's firing, the host probe's
#     wake-ups: most of `write`, the runtimes' eventfd) is inflated by the slowdown.
#     `AB_SYSCALLS=1 bench/cpu_ab.sh` (perf trace, far less intrusive) counts them per OK
#     answer at nearly full speed.
#   - Redis µs/req: the time Redis spent in all commands (INFO commandstats) per request, and
#     the commands used.
#   - errors / shed: floodgate's non-OK answers (its /metrics) plus h2load's failures, and of
#     them the calls shed before Redis (store_errors_total{kind="shed"}); the rest are Redis
#     deadline misses or failures. Limitador's: only h2load's failures (gRPC errors travel in
#     trailers h2load cannot see).
# Then the script cost: lua/apply.lua against bench/gcra_min.lua on a quiet redis-server, the
# request's own EVALSHA captured from the bench and replayed (bench/script_cost.py), and the
# same for a limit counted in ticks finer than a µs (domains fine1 and fine4, floodgate only).
#
# SBS_PIN=1 pins the server to CPU 0 and Redis and h2load to CPU 1 (`taskset`): the server
# then sees one CPU (floodgate serves gRPC on one thread, Limitador runs one worker), and its
# CPU per request is its own work without Redis and the load generator taking turns on its
# core (on a 2-core machine, unpinned, each request's cycles also pay for the caches those
# two leave behind). SBS_ROWS picks rows by number (1 no store, 2 memory, 3 Redis with 1
# descriptor, 4 with 4), SBS_SCRIPT_COST=0 skips the script-cost table.
#
# floodgate runs with leases off (FLOODGATE_LEASE_FRACTION=0, unless set): the load is one hot
# bucket per descriptor, which leases would answer mostly without Redis, and the Redis rows
# compare the per-request Redis path with Limitador's (bench/leases.sh measures leases).
#
# Limitador's limits: one limit per descriptor i, variables ["descriptors[i]['k<i>']"] (one
# counter per value), 10^6 per second like floodgate's.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

SECONDS_PER_RUN=${SBS_SECONDS:-5}
REPEAT=${SBS_REPEAT:-2}
WARMUP_REQUESTS=${SBS_WARMUP_REQUESTS:-20000}
STRACE_REQUESTS=${SBS_STRACE_REQUESTS:-20000}
SCRIPT_CALLS=${SBS_SCRIPT_CALLS:-20000}
export FLOODGATE_LEASE_FRACTION=${FLOODGATE_LEASE_FRACTION:-0}
TARGET=${CARGO_TARGET_DIR:-target}
if [ -z "${BENCH_BIN:-}" ]; then
    cargo build --profile production --quiet --bin floodgate
fi
BIN=${BENCH_BIN:-$TARGET/production/floodgate}

find_limitador
command -v strace >/dev/null || echo "(no strace: no syscall columns)"

# Domain (namespace) `one`: descriptor k0; `four`: k0..k3. Separate, because a Limitador
# limit whose variable a request lacks (descriptors[3] of a 1-descriptor request) fails it.
write_side_by_side_limits
# 10^9 per hour (3.6 µs per token) counts in ticks of 0.1 µs: the script-cost rows only.
for n in 1 4; do
    {
        echo "domain: fine$n"
        echo "descriptors:"
        for i in $(seq 0 $((n - 1))); do
            echo "  - {key: k$i, rate_limit: {unit: hour, requests_per_unit: 1000000000}}"
        done
    } > "$WORK/limits/fine$n.yaml"
    python3 bench/grpc_body.py "fine$n" "$n" "$WORK/fine$n.bin"
done
python3 bench/grpc_body.py nobody 1 "$WORK/noop.bin"

PIN_SERVER=() PIN_LOAD=()
if [ "${SBS_PIN:-0}" = 1 ]; then
    [ "$(nproc)" -ge 2 ] || { echo "SBS_PIN=1 needs 2 CPUs" >&2; exit 2; }
    PIN_SERVER=(taskset -c 0) PIN_LOAD=(taskset -c 1)
fi

start_redis
[ ${#PIN_LOAD[@]} -eq 0 ] || taskset -pc 1 "${PIDS[-1]}" >/dev/null

# start SERVER STORE : starts floodgate or limitador on the store (none, memory, redis); sets
# GRPC_PORT, HTTP_PORT, SRV_PID.
start() {
    local server=$1 store=$2
    GRPC_PORT=$(free_port); HTTP_PORT=$(free_port)
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    if [ "$server" = floodgate ]; then
        local args=()
        [ "$store" = redis ] && args=(--redis-url "redis://127.0.0.1:$REDIS_PORT/")
        RUST_LOG=warn "${PIN_SERVER[@]}" "$BIN" serve --config "$WORK/limits" --grpc-addr "127.0.0.1:$GRPC_PORT" \
            --http-addr "127.0.0.1:$HTTP_PORT" "${args[@]}" >"$WORK/server.log" 2>&1 &
        SRV_PID=$!
        until curl -sf "127.0.0.1:$HTTP_PORT/healthcheck" >/dev/null; do sleep 0.1; done
    else
        local args=(memory)
        [ "$store" = redis ] && args=(redis "redis://127.0.0.1:$REDIS_PORT")
        "${PIN_SERVER[@]}" "$LIMITADOR" -b 127.0.0.1 -p "$GRPC_PORT" -B 127.0.0.1 -P "$HTTP_PORT" \
            "$WORK/limitador.yaml" "${args[@]}" >"$WORK/server.log" 2>&1 &
        SRV_PID=$!
        until python3 -c "import socket; socket.create_connection(('127.0.0.1', $GRPC_PORT), 0.2)" 2>/dev/null; do sleep 0.1; done
    fi
    PIDS+=("$SRV_PID")
}
stop() { kill "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true; }

h2() {
    "${PIN_LOAD[@]}" h2load "$@" -c 16 -m 8 -t 1 -H 'content-type: application/grpc' -H 'te: trailers' \
        "http://127.0.0.1:$GRPC_PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
}

# floodgate's answers that were not OK so far, and the calls shed (0 0 for Limitador).
not_ok() {
    [ "$1" = floodgate ] || { echo "0 0"; return; }
    curl -s "127.0.0.1:$HTTP_PORT/metrics" | awk '
        $1 ~ /^floodgate_requests_total/ { all += $2; if ($1 ~ /result="ok"/) ok += $2 }
        $1 == "floodgate_store_errors_total{kind=\"shed\"}" { shed += $2 }
        END { print all - ok, shed + 0 }'
}

# redis_usec : all commands' calls and µs so far, and "cmd:calls" for each command used.
redis_usec() {
    redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' | awk -F'[=,:]' '
        /^cmdstat_/ && $1 !~ /^cmdstat_(info|flushall|config)/ {
            usec += $5; name = $1; sub("cmdstat_", "", name); names = names name ":" $3 " " }
        END { print usec + 0, names }'
}

TICKS=$(getconf CLK_TCK)
stat_ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
# Context switches (voluntary and not) of every thread of a process.
switches() { cat /proc/"$1"/task/*/status | awk '/ctxt_switches/{s += $2} END {print s}'; }

# throughput SERVER STORE BODY : one timed run; prints "rps user_us sys_us switches errors
# redis_us cmds" (per request).
throughput() {
    local server=$1 store=$2 body=$3
    start "$server" "$store"
    h2 -n "$WARMUP_REQUESTS" --data "$body" >/dev/null 2>&1
    redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
    local u0 s0 u1 s1 e0 e1 sh0 sh1 cs0 cs1
    read -r u0 s0 < <(stat_ticks "$SRV_PID")
    cs0=$(switches "$SRV_PID")
    read -r e0 sh0 < <(not_ok "$server")
    h2 -D "$SECONDS_PER_RUN" --data "$body" >"$WORK/h2.out" 2>&1
    read -r u1 s1 < <(stat_ticks "$SRV_PID")
    cs1=$(switches "$SRV_PID")
    read -r e1 sh1 < <(not_ok "$server")
    local usec cmds
    read -r usec cmds < <(redis_usec)
    stop
    python3 - "$WORK/h2.out" "$u0" "$s0" "$u1" "$s1" "$TICKS" "$e0" "$e1" "$sh0" "$sh1" "$usec" "$((cs1 - cs0))" "${cmds:--}" <<'PY'
import re, sys
out, u0, s0, u1, s1, ticks, e0, e1, sh0, sh1, usec, switches, cmds = sys.argv[1:]
text = open(out).read()
rps = float(re.search(r"finished in [^,]+, ([\d.]+) req/s", text).group(1))
m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", text)
done, failed = int(m.group(1)), int(m.group(3)) + int(m.group(4))
ticks = int(ticks)
user = 1e6 * (int(u1) - int(u0)) / ticks / done
sys_ = 1e6 * (int(s1) - int(s0)) / ticks / done
errors = f"{int(e1) - int(e0) + failed}/{int(sh1) - int(sh0)}"
redis = f"{float(usec) / done:.1f}" if float(usec) else "-"
print(f"{rps:.0f} {user:.1f} {sys_:.1f} {int(switches) / done:.3f} {errors} {redis} {cmds.strip() or '-'}")
PY
}

# syscalls SERVER STORE BODY : prints writev, recvfrom, sendto, write, epoll_wait, futex per
# request, from a separate strace -f -c run of STRACE_REQUESTS requests. recvfrom includes
# the server's reads from Redis on the Redis rows, sendto is its writes to Redis (the gRPC
# sockets are written with writev), write is mostly the runtimes' wake-up eventfd.
syscalls() {
    local server=$1 store=$2 body=$3
    command -v strace >/dev/null || { echo "- - - - - -"; return; }
    start "$server" "$store"
    h2 -n 2000 --data "$body" >/dev/null 2>&1
    strace -f -c -p "$SRV_PID" -o "$WORK/strace.txt" 2>/dev/null &
    local sp=$!
    # strace attaches asynchronously: wait until every thread is traced.
    local deadline=$((SECONDS + 10))
    until [ "$(grep -c '^TracerPid:[[:space:]]*[1-9]' /proc/"$SRV_PID"/task/*/status | awk -F: '{s += $2} END {print s}')" -ge "$(ls /proc/"$SRV_PID"/task | wc -l)" ] || [ $SECONDS -ge $deadline ]; do sleep 0.1; done
    h2 -n "$STRACE_REQUESTS" --data "$body" >/dev/null 2>&1
    kill -INT "$sp"; wait "$sp" || true
    stop
    awk -v n="$STRACE_REQUESTS" '
        $NF ~ /^(writev|recvfrom|sendto|write|epoll_wait|futex)$/ { c[$NF] = ($4 ~ /^[0-9]+$/ ? $4 : $3) }
        END { printf "%.3f %.3f %.3f %.3f %.3f %.3f\n", c["writev"] / n, c["recvfrom"] / n,
              c["sendto"] / n, c["write"] / n,
              c["epoll_wait"] / n, c["futex"] / n }' "$WORK/strace.txt"
}

ROWS=("no store (unknown domain)|none|$WORK/noop.bin"
      "memory, 1 descriptor|memory|$WORK/one.bin"
      "redis, 1 descriptor|redis|$WORK/one.bin"
      "redis, 4 descriptors|redis|$WORK/four.bin")
SERVERS=(floodgate)
[ -n "$LIMITADOR" ] && SERVERS+=(limitador)

echo
echo "| scenario | server | req/s | CPU µs/req user | sys | user + sys | ctx switches/req | errors/shed | Redis µs/req (commands/run) | writev/req | recvfrom/req | sendto/req | write/req | epoll_wait/req | futex/req |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for i in "${!ROWS[@]}"; do
    [[ " ${SBS_ROWS:-1 2 3 4} " == *" $((i + 1)) "* ]] || continue
    IFS='|' read -r name store body <<<"${ROWS[$i]}"
    for server in "${SERVERS[@]}"; do
        read -r w r st wr e f < <(syscalls "$server" "$store" "$body")
        for _ in $(seq "$REPEAT"); do
            read -r rps user sys cs errors redis cmds < <(throughput "$server" "$store" "$body")
            total=$(python3 -c "print(f'{$user + $sys:.1f}')")
            [ "$store" = redis ] || cmds=""
            echo "| $name | $server | $rps | $user | $sys | $total | $cs | $errors | $redis ${cmds:+($cmds)} | $w | $r | $st | $wr | $e | $f |"
        done
    done
done

# --- Script cost: apply.lua against the minimal GCRA script, same buckets ---------------
if [ "${SBS_SCRIPT_COST:-1}" = 0 ]; then
    echo
    echo "machine: $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg), pinned: ${SBS_PIN:-0}, FLOODGATE_LEASE_FRACTION=$FLOODGATE_LEASE_FRACTION"
    exit 0
fi
start floodgate redis
for spec in one:1:capture-1 four:4:capture-4 fine1:1:fine-1 fine4:4:fine-4; do
    IFS=: read -r body n out <<<"$spec"
    python3 bench/script_cost.py capture "$REDIS_PORT" "$n" "$WORK/$out.json" &
    cap=$!
    until [ -s "$WORK/$out.json" ]; do h2 -n 100 --data "$WORK/$body.bin" >/dev/null 2>&1; done
    wait "$cap"
done
stop
QUIET_PORT=$(free_port)
redis-server --port "$QUIET_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --logfile "$WORK/redis-quiet.log" --daemonize no &
PIDS+=($!)
until redis-cli -p "$QUIET_PORT" ping >/dev/null 2>&1; do sleep 0.1; done
# The bench's limits (10^6 per second: 1 µs per token) count in whole µs, as almost every
# configured limit does; 10^9 per hour (3.6 µs per token) counts in ticks of 0.1 µs, which
# costs the script more and which the minimal script would round to whole µs.
echo
echo "| limit | buckets | lua/apply.lua µs/call | bench/gcra_min.lua µs/call | ratio (median) |"
echo "|---|---|---|---|---|"
python3 bench/script_cost.py replay "$QUIET_PORT" "$SCRIPT_CALLS" 5 "$WORK/capture-1.json" \
    "$WORK/capture-4.json" "$WORK/fine-1.json" "$WORK/fine-4.json" |
    python3 -c '
import json, statistics, sys
for i, line in enumerate(sys.stdin):
    r = json.loads(line)
    a, m = r["apply"], r["minimal"]
    f = lambda xs: ", ".join(f"{x:.1f}" for x in xs)
    n = r["buckets"]
    limit = "10^6/second" if i < 2 else "10^9/hour (0.1 µs ticks)"
    print(f"| {limit} | {n} | {f(a)} | {f(m)} | {statistics.median(a) / statistics.median(m):.2f} |")'
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/{print int($2/1048576)}' /proc/meminfo) GiB, $(date -u '+%Y-%m-%d %H:%M UTC'), load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg), Redis $(redis-server --version | awk '{sub("v=", "", $3); print $3}'), $(h2load --version | head -1), pinned: ${SBS_PIN:-0}, FLOODGATE_LEASE_FRACTION=$FLOODGATE_LEASE_FRACTION"
