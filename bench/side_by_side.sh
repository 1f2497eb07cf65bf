#!/usr/bin/env bash
# floodgate beside the floor (examples/floor.rs: a fixed-OK server on floodgate's own stack)
# and Limitador (../shared/peers/limitador-server.gz, or LIMITADOR_BIN): one table, each row
# the same load on every server, fresh server per run.
#
#   bench/side_by_side.sh                      # run by bench/run.sh; also on its own
#   SBS_SECONDS=5 SBS_REPEAT=3 bench/side_by_side.sh
#   BENCH_BIN=/path/floodgate FLOOR_BIN=/path/floor BENCH_LOADGEN=/path/loadgen bench/side_by_side.sh
#
# Rows:
#   1. no store (an unknown domain / namespace), h2load;
#   2. memory with 1 descriptor, h2load (one hot key);
#   3. and 4. the Redis path: Redis with 1 and 4 descriptors, each descriptor's value drawn
#      uniformly from SBS_KEYS (100,000) values by examples/loadgen, floodgate's leases off;
#   5. the hot key: Redis with 1 descriptor, one value (h2load), floodgate's leases at the
#      server's default fraction, so the row shows what leases answer.
# Load: 16 connections × 8 streams, one thread (h2load, or examples/loadgen with the same
# shape where values vary: h2load repeats one body); a warm-up of WARMUP_REQUESTS requests
# first, then SBS_SECONDS of load, SBS_REPEAT times per row and server (each a fresh server)
# to show the spread. The same redis-server serves every Redis row, flushed before each run.
#   - CPU µs/req: the server's user and system time (/proc/<pid>/stat) over the timed run only,
#     per request the load generator completed.
#   - ×floor: that CPU µs/req (user + sys) over the floor's median on the same row: what
#     floodgate (or Limitador) costs over the least a server on floodgate's stack pays. The
#     floor answers every row alike (`--statuses bare` on row 1, as floodgate answers a
#     descriptor no limit matches; statuses under a 10^6/second limit elsewhere).
#   - leases: on the Redis rows, "off", or the share of floodgate's OK answers that leases
#     gave with no Redis call (floodgate_lease_local_answers_total); "-" for the others.
#   - script calls/OK: EVALSHA and EVAL calls Redis received (INFO commandstats) per OK
#     answer (floodgate's floodgate_requests_total{result="ok"}; Limitador's: the load
#     generator's answers, h2load's 2xx or loadgen's OK).
#   - Syscalls per request: a separate run of STRACE_REQUESTS requests (after a warm-up) under
#     `strace -f -c`; strace slows the server, so these are counts, never timed, and what
#     happens per unit of time rather than per request (a timer's firing, the host probe's
#     wake-ups: most of `write`, the runtimes' eventfd) is inflated by the slowdown.
#     `AB_SYSCALLS=1 bench/cpu_ab.sh` (perf trace, far less intrusive) counts them per OK
#     answer at nearly full speed.
#   - Redis µs/req: the time Redis spent in all commands (INFO commandstats) per request, and
#     the commands used.
#   - errors / shed: floodgate's non-OK answers (its /metrics) plus the load generator's
#     failures, and of them the calls shed before Redis (store_errors_total{kind="shed"}); the
#     rest are Redis deadline misses or failures. Limitador's: only the load generator's
#     failures (h2load cannot see gRPC errors, which travel in trailers; loadgen can).
#   - Redis CPU %: redis-server's user + system time over the timed run, in % of one core
#     (Redis runs commands on one thread: near 100 it is what bounds the row); "-" on the rows
#     without Redis. Machine idle %: the idle share of every CPU over the run (/proc/stat).
#     Together they say whether a row is bound by CPU (idle near 0) or by the turns its
#     processes take waiting on each other (idle well above 0, nobody near a full core).
# Then the script cost: lua/apply.lua against bench/gcra_min.lua on a quiet redis-server, the
# request's own EVALSHA captured from the bench and replayed (bench/script_cost.py), and the
# same for a limit counted in ticks finer than a µs (domains fine1 and fine4, floodgate only).
#
# SBS_PIN=1 pins the server to CPU 0 and Redis and the load generator to CPU 1 (`taskset`):
# the server then sees one CPU (floodgate and the floor serve gRPC on one thread, Limitador
# runs one worker), and its CPU per request is its own work without Redis and the load
# generator taking turns on its core (on a 2-core machine, unpinned, each request's cycles
# also pay for the caches those two leave behind). SBS_ROWS picks rows by number (above),
# SBS_SCRIPT_COST=0 skips the script-cost table.
#
# floodgate runs with leases off (FLOODGATE_LEASE_FRACTION=0, unless set) on every row but the
# hot key's: rows 3 and 4 measure the per-request Redis path and compare it with Limitador's
# (bench/leases.sh measures leases at length).
#
# Limitador's limits: one limit per descriptor i, variables ["descriptors[i]['k<i>']"] (one
# counter per value), 10^6 per second like floodgate's.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
need_h2load

SECONDS_PER_RUN=${SBS_SECONDS:-5}
REPEAT=${SBS_REPEAT:-2}
WARMUP_REQUESTS=${SBS_WARMUP_REQUESTS:-20000}
STRACE_REQUESTS=${SBS_STRACE_REQUESTS:-20000}
SCRIPT_CALLS=${SBS_SCRIPT_CALLS:-20000}
KEYS=${SBS_KEYS:-100000}
export FLOODGATE_LEASE_FRACTION=${FLOODGATE_LEASE_FRACTION:-0}
TARGET=${CARGO_TARGET_DIR:-target}
BUILD=()
[ -n "${BENCH_BIN:-}" ] || BUILD+=(--bin floodgate)
[ -n "${FLOOR_BIN:-}" ] || BUILD+=(--example floor)
[ -n "${BENCH_LOADGEN:-}" ] || BUILD+=(--example loadgen)
[ ${#BUILD[@]} -eq 0 ] || cargo build --profile production --quiet "${BUILD[@]}"
BIN=${BENCH_BIN:-$TARGET/production/floodgate}
FLOOR=${FLOOR_BIN:-$TARGET/production/examples/floor}
LOADGEN=${BENCH_LOADGEN:-$TARGET/production/examples/loadgen}

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

# start SERVER STORE : starts floodgate, the floor or limitador on the store (none, memory,
# redis, or redis-leased: floodgate's leases at the server's default); sets GRPC_PORT,
# HTTP_PORT, SRV_PID.
start() {
    local server=$1 store=$2
    GRPC_PORT=$(free_port); HTTP_PORT=$(free_port)
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    case $server in
        floodgate)
            local args=() env=()
            [ "${store#redis}" != "$store" ] && args=(--redis-url "redis://127.0.0.1:$REDIS_PORT/")
            [ "$store" = redis-leased ] && env=(-u FLOODGATE_LEASE_FRACTION)
            RUST_LOG=warn env "${env[@]}" "${PIN_SERVER[@]}" "$BIN" serve --config "$WORK/limits" \
                --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$HTTP_PORT" \
                "${args[@]}" >"$WORK/server.log" 2>&1 &
            SRV_PID=$!
            until curl -sf "127.0.0.1:$HTTP_PORT/healthcheck" >/dev/null; do sleep 0.1; done
            ;;
        floor)
            local statuses=limited
            [ "$store" = none ] && statuses=bare
            "${PIN_SERVER[@]}" "$FLOOR" --grpc-addr "127.0.0.1:$GRPC_PORT" \
                --http-addr "127.0.0.1:$HTTP_PORT" --statuses "$statuses" >"$WORK/server.log" 2>&1 &
            SRV_PID=$!
            until curl -sf "127.0.0.1:$HTTP_PORT/healthcheck" >/dev/null; do sleep 0.1; done
            ;;
        limitador)
            local args=(memory)
            [ "${store#redis}" != "$store" ] && args=(redis "redis://127.0.0.1:$REDIS_PORT")
            "${PIN_SERVER[@]}" "$LIMITADOR" -b 127.0.0.1 -p "$GRPC_PORT" -B 127.0.0.1 -P "$HTTP_PORT" \
                "$WORK/limitador.yaml" "${args[@]}" >"$WORK/server.log" 2>&1 &
            SRV_PID=$!
            until python3 -c "import socket; socket.create_connection(('127.0.0.1', $GRPC_PORT), 0.2)" 2>/dev/null; do sleep 0.1; done
            ;;
    esac
    PIDS+=("$SRV_PID")
}
stop() { kill "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true; }

# load KIND SPEC REQUESTS : one closed-loop load, 16 connections × 8 streams, one thread: of
# REQUESTS requests, or SECONDS_PER_RUN when REQUESTS is 0. KIND h2: h2load repeating the body
# SPEC; lg: examples/loadgen with SPEC "domain:descriptors", each descriptor's value uniform
# over KEYS values (one JSON line out).
load() {
    local kind=$1 spec=$2 requests=$3
    if [ "$kind" = h2 ]; then
        local amount=(-D "$SECONDS_PER_RUN")
        [ "$requests" -gt 0 ] && amount=(-n "$requests")
        "${PIN_LOAD[@]}" h2load "${amount[@]}" -c 16 -m 8 -t 1 --data "$spec" \
            -H 'content-type: application/grpc' -H 'te: trailers' \
            "http://127.0.0.1:$GRPC_PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    else
        local domain=${spec%:*} n=${spec#*:}
        local amount=(--duration "$SECONDS_PER_RUN")
        [ "$requests" -gt 0 ] && amount=(--total "$requests" --duration 3600)
        "${PIN_LOAD[@]}" "$LOADGEN" --addr "http://127.0.0.1:$GRPC_PORT" --domain "$domain" \
            --descriptors "$n" --keys "$KEYS" --distribution uniform --connections 16 \
            --streams 8 --threads 1 --warmup 0 "${amount[@]}"
    fi
}

# counts SERVER : floodgate's (or the floor's) answers so far: "not_ok shed ok
# lease_local_answers" (all 0 for Limitador, which has no such series).
counts() {
    [ "$1" != limitador ] || { echo "0 0 0 0"; return; }
    curl -s "127.0.0.1:$HTTP_PORT/metrics" | awk '
        $1 ~ /^floodgate_requests_total/ { all += $2; if ($1 ~ /result="ok"/) ok += $2 }
        $1 == "floodgate_store_errors_total{kind=\"shed\"}" { shed += $2 }
        $1 ~ /^floodgate_lease_local_answers_total/ { leased += $2 }
        END { print all - ok, shed + 0, ok + 0, leased + 0 }'
}

# redis_usec : all commands' µs so far, the script calls (EVALSHA and EVAL), and "cmd:calls"
# for each command used.
redis_usec() {
    redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' | awk -F'[=,:]' '
        /^cmdstat_/ && $1 !~ /^cmdstat_(info|flushall|config)/ {
            usec += $5; name = $1; sub("cmdstat_", "", name); names = names name ":" $3 " "
            if (name == "evalsha" || name == "eval") scripts += $3 }
        END { print usec + 0, scripts + 0, names }'
}

TICKS=$(getconf CLK_TCK)
stat_ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
# Context switches (voluntary and not) of every thread of a process.
switches() { cat /proc/"$1"/task/*/status | awk '/ctxt_switches/{s += $2} END {print s}'; }
# The machine's idle and total ticks so far, every CPU (/proc/stat: idle + iowait, and all).
machine_ticks() { awk '/^cpu /{print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }

# throughput SERVER STORE KIND SPEC : one timed run; prints "rps user_us sys_us switches
# errors/shed redis_us leases scripts_per_ok cmds" (per request; leases and scripts per OK
# answer).
throughput() {
    local server=$1 store=$2 kind=$3 spec=$4
    start "$server" "$store"
    load "$kind" "$spec" "$WARMUP_REQUESTS" >/dev/null 2>&1
    redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
    local u0 s0 u1 s1 cs0 cs1 c0 c1 ru0 rs0 ru1 rs1 m0 m1
    read -r u0 s0 < <(stat_ticks "$SRV_PID")
    read -r ru0 rs0 < <(stat_ticks "$REDIS_PID")
    m0=$(machine_ticks)
    cs0=$(switches "$SRV_PID")
    c0=$(counts "$server")
    load "$kind" "$spec" 0 >"$WORK/load.out" 2>&1
    read -r u1 s1 < <(stat_ticks "$SRV_PID")
    read -r ru1 rs1 < <(stat_ticks "$REDIS_PID")
    m1=$(machine_ticks)
    cs1=$(switches "$SRV_PID")
    c1=$(counts "$server")
    local usec scripts cmds
    read -r usec scripts cmds < <(redis_usec)
    local leases=-
    if [ "$server" = floodgate ] && [ "${store#redis}" != "$store" ]; then
        leases=on
        [ "$store" = redis ] && [ "$FLOODGATE_LEASE_FRACTION" = 0 ] && leases=off
    fi
    stop
    local redis_ticks=-
    [ "${store#redis}" != "$store" ] && redis_ticks=$((ru1 + rs1 - ru0 - rs0))
    python3 - "$WORK/load.out" "$kind" "$u0 $s0 $u1 $s1" "$TICKS" "$c0" "$c1" "$usec" \
        "$scripts" "$((cs1 - cs0))" "$leases" "${cmds:--}" "$redis_ticks" "$m0 $m1" "$(nproc)" <<'PY'
import json, re, sys
(out, kind, ticks_, per_tick, c0, c1, usec, scripts, switches, leases, cmds, redis_ticks,
 machine, cpus) = sys.argv[1:]
u0, s0, u1, s1 = map(int, ticks_.split())
text = open(out).read()
if kind == "h2":
    rps = float(re.search(r"finished in [^,]+, ([\d.]+) req/s", text).group(1))
    m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", text)
    done, failed = int(m.group(1)), int(m.group(3)) + int(m.group(4))
    # h2load's 2xx: OK answers for a server whose own count is not read (Limitador).
    seen_ok = int(m.group(2))
else:
    line = json.loads(next(l for l in text.splitlines() if l.startswith("{")))
    rps, done, failed = line["rps"], line["requests"], line["errors"]
    seen_ok = line["answers"].get("ok", 0)
n0, sh0, ok0, l0 = map(int, c0.split())
n1, sh1, ok1, l1 = map(int, c1.split())
ok = ok1 - ok0 if ok1 > ok0 else seen_ok
ticks = int(per_tick)
user = 1e6 * (u1 - u0) / ticks / done
sys_ = 1e6 * (s1 - s0) / ticks / done
errors = f"{n1 - n0 + failed}/{sh1 - sh0}"
redis = f"{float(usec) / done:.1f}" if float(usec) else "-"
if leases == "on":
    leases = f"on: {(l1 - l0) / max(ok, 1):.3f} of OK"
per_ok = f"{int(scripts) / max(ok, 1):.3f}" if leases != "-" or int(scripts) else "-"
idle0, all0, idle1, all1 = map(int, machine.split())
wall = (all1 - all0) / int(cpus)
idle = f"{100 * (idle1 - idle0) / max(all1 - all0, 1):.0f}"
redis_cpu = f"{100 * int(redis_ticks) / max(wall, 1):.0f}" if redis_ticks != "-" else "-"
print(f"{rps:.0f} {user:.1f} {sys_:.1f} {int(switches) / done:.3f} {errors} {redis} "
      f"{leases.replace(' ', '_')} {per_ok} {redis_cpu} {idle} {cmds.strip() or '-'}")
PY
}

# syscalls SERVER STORE KIND SPEC : prints writev, recvfrom, sendto, write, epoll_wait, futex
# per request, from a separate strace -f -c run of STRACE_REQUESTS requests. recvfrom
# includes the server's reads from Redis on the Redis rows, sendto is its writes to Redis
# (the gRPC sockets are written with writev), write is mostly the runtimes' wake-up eventfd.
syscalls() {
    local server=$1 store=$2 kind=$3 spec=$4
    command -v strace >/dev/null || { echo "- - - - - -"; return; }
    start "$server" "$store"
    load "$kind" "$spec" 2000 >/dev/null 2>&1
    strace -f -c -p "$SRV_PID" -o "$WORK/strace.txt" 2>/dev/null &
    local sp=$!
    # strace attaches asynchronously: wait until every thread is traced.
    local deadline=$((SECONDS + 10))
    until [ "$(grep -c '^TracerPid:[[:space:]]*[1-9]' /proc/"$SRV_PID"/task/*/status | awk -F: '{s += $2} END {print s}')" -ge "$(ls /proc/"$SRV_PID"/task | wc -l)" ] || [ $SECONDS -ge $deadline ]; do sleep 0.1; done
    load "$kind" "$spec" "$STRACE_REQUESTS" >/dev/null 2>&1
    kill -INT "$sp"; wait "$sp" || true
    stop
    awk -v n="$STRACE_REQUESTS" '
        $NF ~ /^(writev|recvfrom|sendto|write|epoll_wait|futex)$/ { c[$NF] = ($4 ~ /^[0-9]+$/ ? $4 : $3) }
        END { printf "%.3f %.3f %.3f %.3f %.3f %.3f\n", c["writev"] / n, c["recvfrom"] / n,
              c["sendto"] / n, c["write"] / n,
              c["epoll_wait"] / n, c["futex"] / n }' "$WORK/strace.txt"
}

ROWS=("no store (unknown domain)|none|h2|$WORK/noop.bin"
      "memory, 1 descriptor|memory|h2|$WORK/one.bin"
      "redis, 1 descriptor, $KEYS uniform keys|redis|lg|one:1"
      "redis, 4 descriptors, $KEYS uniform keys|redis|lg|four:4"
      "redis, 1 descriptor, one hot key|redis-leased|h2|$WORK/one.bin")
SERVERS=(floor floodgate)
[ -n "$LIMITADOR" ] && SERVERS+=(limitador)

echo
echo "| scenario | server | req/s | CPU µs/req user | sys | user + sys | ×floor | leases | script calls/OK | ctx switches/req | errors/shed | Redis µs/req (commands/run) | writev/req | recvfrom/req | sendto/req | write/req | epoll_wait/req | futex/req | Redis CPU % of a core | machine idle % |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for i in "${!ROWS[@]}"; do
    [[ " ${SBS_ROWS:-1 2 3 4 5} " == *" $((i + 1)) "* ]] || continue
    IFS='|' read -r name store kind spec <<<"${ROWS[$i]}"
    floor_runs=()
    for server in "${SERVERS[@]}"; do
        read -r w r st wr e f < <(syscalls "$server" "$store" "$kind" "$spec")
        for _ in $(seq "$REPEAT"); do
            read -r rps user sys cs errors redis leases per_ok redis_cpu idle cmds < <(throughput "$server" "$store" "$kind" "$spec")
            total=$(python3 -c "print(f'{$user + $sys:.1f}')")
            [ "$server" = floor ] && floor_runs+=("$total")
            over=$(python3 -c "import statistics, sys; f = statistics.median(map(float, sys.argv[2:])); print(f'{float(sys.argv[1]) / f:.2f}' if f else '-')" "$total" "${floor_runs[@]}")
            [ "${store#redis}" != "$store" ] && [ "$cmds" != - ] || cmds=""
            echo "| $name | $server | $rps | $user | $sys | $total | $over | ${leases//_/ } | $per_ok | $cs | $errors | $redis ${cmds:+($cmds)} | $w | $r | $st | $wr | $e | $f | $redis_cpu | $idle |"
        done
    done
done

# --- Script cost: apply.lua against the minimal GCRA script, same buckets ---------------
if [ "${SBS_SCRIPT_COST:-1}" = 0 ]; then
    echo
    echo "machine: $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg), pinned: ${SBS_PIN:-0}, FLOODGATE_LEASE_FRACTION=$FLOODGATE_LEASE_FRACTION (row 5: the server's default), $KEYS uniform keys (rows 3 and 4)"
    exit 0
fi
start floodgate redis
for spec in one:1:capture-1 four:4:capture-4 fine1:1:fine-1 fine4:4:fine-4; do
    IFS=: read -r body n out <<<"$spec"
    python3 bench/script_cost.py capture "$REDIS_PORT" "$n" "$WORK/$out.json" &
    cap=$!
    # One request in flight at a time, so each EVALSHA is one request's own (requests ready
    # together are merged into one call, whose KEYS the capture would not take for one
    # request's); given up after 30 s rather than waiting for ever.
    deadline=$((SECONDS + 30))
    until [ -s "$WORK/$out.json" ] || [ "$SECONDS" -ge "$deadline" ]; do
        h2load -n 20 -c 1 -m 1 -t 1 --data "$WORK/$body.bin" \
            -H 'content-type: application/grpc' -H 'te: trailers' \
            "http://127.0.0.1:$GRPC_PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
            >/dev/null 2>&1
    done
    [ -s "$WORK/$out.json" ] || { kill "$cap" 2>/dev/null; echo "no single-request EVALSHA of $body captured in 30 s" >&2; exit 1; }
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
echo "machine: $(nproc) cores, $(awk '/MemTotal/{print int($2/1048576)}' /proc/meminfo) GiB, $(date -u '+%Y-%m-%d %H:%M UTC'), load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg), Redis $(redis-server --version | awk '{sub("v=", "", $3); print $3}'), $(h2load --version | head -1), pinned: ${SBS_PIN:-0}, FLOODGATE_LEASE_FRACTION=$FLOODGATE_LEASE_FRACTION (row 5: the server's default), $KEYS uniform keys (rows 3 and 4)"
