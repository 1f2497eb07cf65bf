#!/usr/bin/env bash
# The data path through a real Envoy: what asking a rate-limit server costs a request that
# Envoy forwards, and how much of it any server on floodgate's stack would still cost (the
# floor, examples/floor.rs). h2load → Envoy (.tools/bin/envoy, --concurrency 1) → a backend
# that answers 200 at once, with Envoy's HTTP rate-limit filter asking, in turn: nobody (no
# filter), the floor, floodgate (memory; Redis), Limitador (memory; Redis: from
# ../shared/peers/limitador-server.gz, or LIMITADOR_BIN; skipped when there is none).
#
#   bench/envoy_path.sh                          # 10 s per run, 2 rounds
#   EP_SECONDS=5 EP_ROUNDS=1 bench/envoy_path.sh
#   EP_ROWS="nobody floor floodgate-memory" bench/envoy_path.sh   # "nobody" always runs first
#   BENCH_BIN=/path/floodgate FLOOR_BIN=/path/floor bench/envoy_path.sh
#   EP_PIN=1 bench/envoy_path.sh                 # the front Envoy alone on CPU 0
#
# The set-up:
#   - The front Envoy: one worker (--concurrency 1), hot restart off, admin and listener on
#     port 0 (read back from --admin-address-path and the admin's /listeners). Its one route
#     forwards to the backend cluster with `rate_limits` of one descriptor, (k0, the request's
#     :path), and the filter is tests/support/envoy.rs's (domain `one`, fail open, x-ratelimit
#     headers) with deploy/envoy/envoy.yaml's timeout (EP_RLS_TIMEOUT, 0.075s). The rate-limit
#     cluster speaks HTTP/2 to one server on loopback.
#   - The backend: a second Envoy (one worker), its listener answering every request with a
#     direct response 200 (Envoy's filter does not rate limit a route with a direct response,
#     so the front must forward). A process of its own, so the front Envoy's CPU is its own.
#   - The load: h2load, one thread, HTTP/2 cleartext to the front, cycling through EP_KEYS
#     (100,000) paths /k/<n>: that many descriptor values, so the Redis rows measure the
#     per-request Redis path (floodgate's leases off, FLOODGATE_LEASE_FRACTION=0 unless set).
#   - The limits: 10^6 per second per value (bench/common.sh: floodgate's domain `one`,
#     Limitador's namespace `one`), so nothing is ever over limit: any 4xx or `over_limit`
#     printed is a fault of the set-up.
# Each run (fresh server and front Envoy): a warm-up of EP_WARMUP_REQUESTS requests, then
#   - closed loop: EP_SECONDS of 16 connections × 4 streams (64 requests in flight): req/s
#     through Envoy, and its share of no-filter's req/s in the same round;
#   - open loop: EP_SECONDS at EP_OPEN_SHARE (0.5) of no-filter's closed-loop req/s in the
#     same round (h2load --rps, 16 connections × up to 16 streams, so a slow answer never holds
#     back the next request), each request's latency from h2load's --log-file
#     (bench/latency.py): p50 and p99,
#     and what each adds over no-filter's at the same rate. The rate h2load reached is printed
#     beside the target: a row that cannot keep up shows it there and in its latencies.
# EP_PIN=1 pins the front Envoy to CPU 0 and everything else (h2load, the backend, the
# rate-limit server, Redis) to CPU 1 (`taskset`; the server then sees one CPU and serves on
# one thread): the front's throughput is then what its own work per request allows, the
# filter's gRPC client included, and no longer what is left of two cores once the
# rate-limit server and Redis have taken their share. In production the rate-limit server
# and Redis run on machines of their own; pinned, a row's share says what its answers cost
# Envoy itself (and what their latency costs it: 64 in flight).
# CPU per request (closed loop): Envoy's (the front's user + system time, /proc/<pid>/stat)
# and the rate-limit server's, per request h2load completed, and the server's over Envoy's:
# rate-limit server cores per Envoy core at this load. Answers: h2load's HTTP status classes
# over both runs (429 is a 4xx; 5xx an Envoy or backend failure), and the filter's counters
# from Envoy's /stats (cluster.backend.ratelimit.ok / over_limit / error: error is a failed or
# timed-out call, which fail-open lets through).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
need_h2load
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

SECONDS_PER_RUN=${EP_SECONDS:-10}
ROUNDS=${EP_ROUNDS:-2}
WARMUP_REQUESTS=${EP_WARMUP_REQUESTS:-20000}
KEYS=${EP_KEYS:-100000}
OPEN_SHARE=${EP_OPEN_SHARE:-0.5}
RLS_TIMEOUT=${EP_RLS_TIMEOUT:-0.075s}
read -r -a ROWS <<<"${EP_ROWS:-nobody floor floodgate-memory floodgate-redis limitador-memory limitador-redis}"
export FLOODGATE_LEASE_FRACTION=${FLOODGATE_LEASE_FRACTION:-0}
PIN=${EP_PIN:-0} FRONT_CPU="" CORES=$(nproc)
if [ "$PIN" = 1 ]; then
    [ "$CORES" -ge 2 ] || { echo "EP_PIN=1 needs 2 CPUs" >&2; exit 2; }
    # This shell and so everything it starts on CPU 1; the front Envoy alone on CPU 0.
    taskset -pc 1 $$ >/dev/null
    FRONT_CPU=0
fi
envoy_and_servers

find_limitador
write_side_by_side_limits
start_redis
seq 0 $((KEYS - 1)) | sed 's|^|/k/|' >"$WORK/paths.txt"
start_backend

# h2 ARGS... : h2load to the front listener, one thread, cycling through the paths.
h2() {
    h2load -t 1 -B "http://127.0.0.1:$FRONT_PORT" -i "$WORK/paths.txt" "$@"
}

TICKS=$(getconf CLK_TCK)

# run ROW NOFILTER_RPS : one fresh server and front Envoy; prints "rps envoy_ticks rls_ticks
# done open_rps(target) p50_ms p99_ms 2xx 4xx 5xx ok over error" (the open loop at OPEN_SHARE
# of NOFILTER_RPS, or of this run's own rps when 0).
run() {
    local row=$1 nofilter=$2
    start_rls "$row"
    front_config "$GRPC_PORT" >"$WORK/front.yaml"
    ENVOY_CPU=$FRONT_CPU start_envoy front "$WORK/front.yaml"
    local front_pid=$ENVOY_PID
    FRONT_PORT=$(listener_port "$ENVOY_ADMIN" front)
    h2 -n "$WARMUP_REQUESTS" -c 16 -m 4 >/dev/null 2>&1
    local s0 e0 r0 s1 e1 r1
    s0=$(ratelimit_stats)
    e0=$(cpu_ticks "$front_pid"); r0=$(cpu_ticks "$SRV_PID")
    h2 -D "$SECONDS_PER_RUN" -c 16 -m 4 >"$WORK/closed.out" 2>&1
    e1=$(cpu_ticks "$front_pid"); r1=$(cpu_ticks "$SRV_PID")
    local rps
    rps=$(sed -n 's/.*finished in [^,]*, \([0-9.]*\) req\/s.*/\1/p' "$WORK/closed.out")
    [ "$nofilter" != 0 ] || nofilter=$rps
    local per_client
    per_client=$(python3 -c "print(max(1, round($nofilter * $OPEN_SHARE / 16)))")
    rm -f "$WORK/open.log"
    h2 -D "$SECONDS_PER_RUN" -c 16 -m 16 --rps "$per_client" --log-file "$WORK/open.log" \
        >"$WORK/open.out" 2>&1
    s1=$(ratelimit_stats)
    kill "$front_pid"; wait "$front_pid" 2>/dev/null || true
    [ -z "$SRV_PID" ] || { kill "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true; }
    local p50 p99
    read -r _ p50 p99 _ _ < <(python3 bench/latency.py "$WORK/open.log")
    python3 - "$WORK/closed.out" "$WORK/open.out" "$p50 $p99" "$rps" "$((e1 - e0))" \
        "$((r1 - r0))" "$s0" "$s1" "$((per_client * 16))" <<'PY'
import re, sys
closed, opened, latency, rps, envoy, rls, s0, s1, target = sys.argv[1:]
def h2load(path):
    text = open(path).read()
    done = int(re.search(r"requests: \d+ total, \d+ started, (\d+) done", text).group(1))
    codes = re.search(r"status codes: (\d+) 2xx, \d+ 3xx, (\d+) 4xx, (\d+) 5xx", text)
    rate = float(re.search(r"finished in [^,]+, ([\d.]+) req/s", text).group(1))
    return done, [int(g) for g in codes.groups()], rate
done, codes, _ = h2load(closed)
_, open_codes, open_rps = h2load(opened)
stats = [b - a for a, b in zip(map(int, s0.split()), map(int, s1.split()))]
codes = [a + b for a, b in zip(codes, open_codes)]
print(rps, envoy, rls, done, f"{open_rps:.0f}({target})", latency,
      *codes, *stats)
PY
}

echo
echo "| round | filter asks | req/s through Envoy | share of no-filter | Envoy CPU µs/req | RLS CPU µs/req | RLS cores per Envoy core | open loop req/s (target) | p50 ms | p99 ms | p50 added ms | p99 added ms | HTTP 2xx/4xx/5xx | ratelimit ok/over_limit/error |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
[ "${ROWS[0]}" = nobody ] || ROWS=(nobody "${ROWS[@]}")
for round in $(seq "$ROUNDS"); do
    nofilter=0 base_p50=0 base_p99=0
    for row in "${ROWS[@]}"; do
        if [ "${row%-*}" = limitador ] && [ -z "$LIMITADOR" ]; then continue; fi
        read -r rps envoy rls answered open p50 p99 c2 c4 c5 ok over err < <(run "$row" "$nofilter")
        if [ "$row" = nobody ]; then nofilter=$rps base_p50=$p50 base_p99=$p99; fi
        python3 - "$round" "$row" "$rps" "$nofilter" "$envoy" "$rls" "$answered" "$TICKS" "$open" \
            "$p50" "$p99" "$base_p50" "$base_p99" "$c2/$c4/$c5" "$ok/$over/$err" <<'PY'
import sys
(round_, row, rps, nofilter, envoy, rls, done, ticks, open_rps, p50, p99, b50, b99, codes,
 stats) = sys.argv[1:]
done, ticks = int(done), int(ticks)
envoy_us = 1e6 * int(envoy) / ticks / done
rls_us = 1e6 * int(rls) / ticks / done
nobody = row == "nobody"
label = {"nobody": "nobody (no filter)", "floor": "the floor"}.get(row, row.replace("-", ", "))
print(f"| {round_} | {label} | {float(rps):.0f} | {float(rps) / float(nofilter):.2f} | "
      f"{envoy_us:.1f} | {'-' if nobody else f'{rls_us:.1f}'} | "
      f"{'-' if nobody else f'{rls_us / envoy_us:.2f}'} | {open_rps.replace('(', ' (')} | {p50} | {p99} | "
      f"{float(p50) - float(b50):+.2f} | {float(p99) - float(b99):+.2f} | {codes} | "
      f"{'-' if nobody else stats} |")
PY
    done
done
echo
echo "machine: $CORES cores, pinned: $PIN, $(date -u '+%Y-%m-%d %H:%M UTC'), load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg), Envoy $("$ENVOY" --version 2>/dev/null | awk '/version:/{print $NF}'), Redis $(redis-server --version | awk '{sub("v=", "", $3); print $3}'), $(h2load --version | head -1), $KEYS paths, $SECONDS_PER_RUN s per run, open loop at $OPEN_SHARE of no-filter, FLOODGATE_LEASE_FRACTION=$FLOODGATE_LEASE_FRACTION"
