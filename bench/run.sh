#!/usr/bin/env bash
# Benchmarks floodgate and prints one markdown table, then a few derived figures.
#
#   bench/run.sh                 # 10 s per scenario after 2 s of warm-up
#   BENCH_SECONDS=30 bench/run.sh
#   BENCH_BIN=/path/floodgate BENCH_LOADGEN=/path/loadgen bench/run.sh   # compare builds
#   BENCH_FILL_KEYS=100000 bench/run.sh   # a smaller "live buckets" fill (default 1 million)
#
# Scenarios: the no-store path (unknown domain: plan only), the memory store and the Redis
# store with 1, 4 and 10 descriptors per request, driven by h2load (HTTP/2, gRPC framing): 16
# connections × 8 concurrent streams (closed loop: a new request as soon as one is answered),
# one h2load thread, all on loopback; plus a light-load row (4 connections × 1 stream).
# h2load repeats one request body, so the many-keys rows use examples/loadgen.rs (a gRPC
# client over h2, same load shape, one thread) to spread descriptor values over 1 million keys,
# uniformly and Zipf-skewed (s = 1), with their own no-store row as the baseline of their
# ratio. Then a Redis Cluster of 3 masters on loopback, 1 and 4 descriptors (one EVALSHA per
# hash slot a request touches, sent in parallel). Limits are large, so every request is fully
# evaluated and admitted.
#
# Columns: "ratio" is req/s over the no-store row of the same load generator; "EVALSHA/req"
# counts the script calls Redis received per request, "Redis µs/call" the time Redis spent per
# script call (INFO commandstats); "floodgate CPU %" is its user + system time over the run
# (warm-up included) as % of one core, and "CPU µs/req" that time per request it answered —
# the figure to compare optimisations by on a noisy machine; "errors" counts requests
# floodgate did not answer OK (from its /metrics: gRPC errors travel in HTTP/2 trailers with
# HTTP status 200, which h2load cannot see).
#
# After the table: the 10-descriptor / 1-descriptor time ratios, the memory store holding a
# million live buckets (RSS, and the buckets gauge falling back once they expire), and Redis
# MEMORY USAGE of one token bucket.
#
# Then bench/side_by_side.sh: the same load on the floor (examples/floor.rs), floodgate and
# Limitador (from ../shared/peers/ when present), CPU µs/request split into user and system
# and over the floor's, syscalls per request under strace, Redis µs per request, whether
# leases answered and script calls per OK answer, and lua/apply.lua's Redis time per call
# beside the minimal GCRA script bench/gcra_min.lua (see that script's header).
#
# Each scenario block starts and stops its own floodgate (start_floodgate / stop_floodgate),
# so blocks can be added or removed independently.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh

SECONDS_PER_RUN=${BENCH_SECONDS:-10}
WARMUP=${BENCH_WARMUP:-2}
FILL_KEYS=${BENCH_FILL_KEYS:-1000000}
CONNECTIONS=16
STREAMS=8

need_h2load
scripts/install-test-tools.sh >/dev/null

TARGET=${CARGO_TARGET_DIR:-target}
if [ -z "${BENCH_BIN:-}" ] || [ -z "${BENCH_LOADGEN:-}" ]; then
    cargo build --profile production --quiet --bin floodgate --example loadgen
fi
BIN=${BENCH_BIN:-$TARGET/production/floodgate}
LOADGEN=${BENCH_LOADGEN:-$TARGET/production/examples/loadgen}

# Domain `bench`, k0..k9: ten descriptors of huge limits (every request admitted, buckets
# full again within microseconds). Domain `fill`: one request per 2 minutes per key, so each
# bucket a request touches stays live for 2 minutes (the live-buckets and MEMORY USAGE rows).
mkdir "$WORK/limits"
{
    echo "domain: bench"
    echo "descriptors:"
    for i in 0 1 2 3 4 5 6 7 8 9; do
        echo "  - {key: k$i, rate_limit: {unit: second, requests_per_unit: 1000000}}"
    done
} > "$WORK/limits/bench.yaml"
cat > "$WORK/limits/fill.yaml" <<'YAML'
domain: fill
descriptors:
  - {key: k0, rate_limit: {unit: minute, unit_multiplier: 2, requests_per_unit: 1}}
YAML
python3 bench/grpc_body.py nobody 1 "$WORK/noop.bin"
python3 bench/grpc_body.py bench 1 "$WORK/one.bin"
python3 bench/grpc_body.py bench 4 "$WORK/four.bin"
python3 bench/grpc_body.py bench 10 "$WORK/ten.bin"

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --logfile "$WORK/redis.log" --daemonize no &
PIDS+=($!)
until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.1; done

# start_floodgate NAME ARGS... : starts a server, sets GRPC_PORT, HTTP_PORT and FG_PID.
start_floodgate() {
    local name=$1; shift
    GRPC_PORT=$(free_port); HTTP_PORT=$(free_port)
    RUST_LOG=warn "$BIN" serve --config "$WORK/limits" \
        --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$HTTP_PORT" "$@" \
        >"$WORK/$name.log" 2>&1 &
    FG_PID=$!; PIDS+=("$FG_PID")
    until curl -sf "127.0.0.1:$HTTP_PORT/healthcheck" >/dev/null; do sleep 0.1; done
}

stop_floodgate() { kill "$FG_PID"; wait "$FG_PID" 2>/dev/null || true; }

# evalsha_stats : EVALSHA calls so far and the µs spent in them, summed over STATS_PORTS
# (the standalone Redis; the masters during the Redis Cluster rows).
STATS_PORTS=("$REDIS_PORT")
evalsha_stats() {
    for port in "${STATS_PORTS[@]}"; do redis-cli -p "$port" info commandstats; done |
        awk -F'[=,:]' '/^cmdstat_evalsha:/{calls += $3; usec += $5} END {print calls + 0, usec + 0}'
}

# cpu_ticks PID : user + system CPU time of PID, in clock ticks.
TICKS=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# metric NAME : a floodgate metric (summed over its series), 0 if absent.
metric() {
    curl -s "127.0.0.1:$HTTP_PORT/metrics" |
        awk -v m="$1" '$1 == m || index($1, m "{") == 1 {s += $2; found=1} END {print (found ? s : 0)}'
}

rss_mib() { awk '/VmRSS/{print int($2/1024)}' "/proc/$FG_PID/status"; }

# Baselines for the ratio column, per load generator.
NOSTORE_H2LOAD=""
NOSTORE_LOADGEN=""
declare -A RPS

# measure NAME RATIO_BASE COMMAND... : runs COMMAND (which must leave "rps p50 p99 p999 bad
# overlap" in $WORK/result) around floodgate and Redis counters, and prints a table row.
# "bad" are the load generator's own failures: disjoint from floodgate's non-OK answers for
# h2load (HTTP statuses; overlap 0), a superset of them for loadgen (gRPC codes; overlap 1).
measure() {
    local name=$1 base=$2; shift 2
    local before usec_before after usec_after
    read -r before usec_before < <(evalsha_stats)
    local ok_before all_before cpu_before t_before
    ok_before=$(metric 'floodgate_requests_total{result="ok"}')
    all_before=$(metric floodgate_requests_total)
    cpu_before=$(cpu_ticks "$FG_PID")
    t_before=$(date +%s.%N)
    "$@"
    local t_after cpu_after ok_after all_after
    t_after=$(date +%s.%N)
    cpu_after=$(cpu_ticks "$FG_PID")
    read -r after usec_after < <(evalsha_stats)
    ok_after=$(metric 'floodgate_requests_total{result="ok"}')
    all_after=$(metric floodgate_requests_total)
    local rps p50 p99 p999 bad overlap
    read -r rps p50 p99 p999 bad overlap < "$WORK/result"
    RPS[$name]=$rps
    local answered=$((all_after - all_before))
    local errors=$((answered - (ok_after - ok_before)))
    if [ "$overlap" -eq 1 ]; then
        errors=$((errors > bad ? errors : bad))
    else
        errors=$((errors + bad))
    fi
    python3 - "$name" "$rps" "${base:-0}" "$p50" "$p99" "$p999" "$before" "$after" \
        "$usec_before" "$usec_after" "$answered" "$errors" "$cpu_before" "$cpu_after" \
        "$TICKS" "$t_before" "$t_after" "$(rss_mib)" <<'PY'
import sys
(name, rps, base, p50, p99, p999, before, after, usec_before, usec_after, answered, errors,
 cpu_before, cpu_after, ticks, t_before, t_after, rss) = sys.argv[1:]
rps, base = float(rps), float(base)
calls, answered = int(after) - int(before), int(answered)
ratio = f"{rps / base:.2f}" if base else "1.00"
per_req = f"{calls / answered:.2f}" if answered and calls else "0"
redis_us = f"{(float(usec_after) - float(usec_before)) / calls:.1f}" if calls else "-"
cpu_s = (int(cpu_after) - int(cpu_before)) / int(ticks)
wall = float(t_after) - float(t_before)
cpu_pct = f"{100 * cpu_s / wall:.0f}"
cpu_us = f"{1e6 * cpu_s / answered:.1f}" if answered else "-"
print(f"| {name} | {rps:.0f} | {ratio} | {p50} | {p99} | {p999} | {per_req} | {redis_us} "
      f"| {errors} | {cpu_pct} | {cpu_us} | {rss} |")
PY
}

# h2load_run BODY [CONNECTIONS STREAMS] : one h2load run against GRPC_PORT.
h2load_run() {
    local body=$1 c=${2:-$CONNECTIONS} m=${3:-$STREAMS}
    # h2load appends to its log file: each run starts a fresh one, or its percentiles would
    # mix in every earlier row's requests.
    rm -f "$WORK/h2.log"
    h2load --warm-up-time="$WARMUP" -D "$SECONDS_PER_RUN" -c "$c" -m "$m" -t 1 \
        --data "$body" -H 'content-type: application/grpc' -H 'te: trailers' \
        --log-file "$WORK/h2.log" \
        "http://127.0.0.1:$GRPC_PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
        >"$WORK/h2.out" 2>&1
    local rps count p50 p99 p999 bad
    rps=$(awk '/^finished in/{gsub(",","",$4); print $4}' "$WORK/h2.out")
    read -r count p50 p99 p999 bad < <(python3 bench/latency.py "$WORK/h2.log")
    echo "$rps $p50 $p99 $p999 $bad 0" > "$WORK/result"
}

# loadgen_run ARGS... : one loadgen run against GRPC_PORT (same load shape as h2load).
loadgen_run() {
    "$LOADGEN" --addr "http://127.0.0.1:$GRPC_PORT" --connections "$CONNECTIONS" \
        --streams "$STREAMS" --duration "$SECONDS_PER_RUN" --warmup "$WARMUP" "$@" \
        >"$WORK/loadgen.json" 2>"$WORK/loadgen.err"
    python3 - "$WORK/loadgen.json" > "$WORK/result" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['rps']:.1f} {r['p50_ms']:.2f} {r['p99_ms']:.2f} {r['p999_ms']:.2f} {r['errors']} 1")
PY
}

# run NAME BODY [C S] : an h2load row; loadgen_row NAME ARGS... : a loadgen row.
run() { local name=$1; shift; measure "$name" "$NOSTORE_H2LOAD" h2load_run "$@"; }
loadgen_row() { local name=$1; shift; measure "$name" "$NOSTORE_LOADGEN" loadgen_run "$@"; }

MANY=(--keys 1000000)

echo
echo "| scenario | req/s | ratio to no-store | p50 ms | p99 ms | p999 ms | EVALSHA/req | Redis µs/call | errors | floodgate CPU % | CPU µs/req | floodgate RSS MiB |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"

# --- Memory store (and the no-store path) ---------------------------------------------
start_floodgate memory --memory-max-buckets 2000000
run "no store (unknown domain)" "$WORK/noop.bin"
NOSTORE_H2LOAD=${RPS["no store (unknown domain)"]}
run "memory, 1 descriptor" "$WORK/one.bin"
run "memory, 4 descriptors" "$WORK/four.bin"
run "memory, 10 descriptors" "$WORK/ten.bin"
loadgen_row "no store (unknown domain), loadgen" --domain nobody
NOSTORE_LOADGEN=${RPS["no store (unknown domain), loadgen"]}
loadgen_row "memory, 1 descriptor, 1M keys uniform, loadgen" --domain bench "${MANY[@]}"
loadgen_row "memory, 1 descriptor, 1M keys Zipf s=1, loadgen" --domain bench "${MANY[@]}" --distribution zipf
stop_floodgate

# --- Redis store ----------------------------------------------------------------------
start_floodgate redis --redis-url "redis://127.0.0.1:$REDIS_PORT/"
run "redis, 1 descriptor" "$WORK/one.bin"
run "redis, 4 descriptors" "$WORK/four.bin"
run "redis, 10 descriptors" "$WORK/ten.bin"
run "redis, 1 descriptor, light load (4 × 1)" "$WORK/one.bin" 4 1
loadgen_row "redis, 1 descriptor, 1M keys uniform, loadgen" --domain bench "${MANY[@]}"
loadgen_row "redis, 1 descriptor, 1M keys Zipf s=1, loadgen" --domain bench "${MANY[@]}" --distribution zipf
stop_floodgate

# --- Redis store, 1 s deadline: raw capacity, no request cut off at saturation ---------
start_floodgate redis-slow --redis-url "redis://127.0.0.1:$REDIS_PORT/" --redis-timeout-ms 1000
run "redis, 1 descriptor, 1 s deadline" "$WORK/one.bin"
run "redis, 4 descriptors, 1 s deadline" "$WORK/four.bin"
stop_floodgate

# --- Redis Cluster (3 masters): one EVALSHA per hash slot a request touches, in parallel. ---
# Self-contained: its own nodes; evalsha_stats sums over the masters while it runs.
CLUSTER_PORTS=()
for _ in 1 2 3; do
    port=$(free_port)
    mkdir -p "$WORK/cluster-$port"
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --cluster-enabled yes --cluster-config-file "$WORK/cluster-$port/nodes.conf" \
        --cluster-port "$(free_port)" --dir "$WORK/cluster-$port" \
        --logfile "$WORK/cluster-$port.log" --daemonize no &
    PIDS+=($!); CLUSTER_PORTS+=("$port")
done
for port in "${CLUSTER_PORTS[@]}"; do
    until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
done
# shellcheck disable=SC2046 # one argument per node
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${CLUSTER_PORTS[@]}") --cluster-yes >"$WORK/cluster-create.log"
for port in "${CLUSTER_PORTS[@]}"; do
    until redis-cli -p "$port" cluster info | grep -q cluster_state:ok; do sleep 0.1; done
done
STATS_PORTS=("${CLUSTER_PORTS[@]}")
SEEDS=$(printf 'redis://127.0.0.1:%s,' "${CLUSTER_PORTS[@]}")
start_floodgate cluster --redis-cluster "${SEEDS%,}"
run "redis cluster (3 masters), 1 descriptor" "$WORK/one.bin"
run "redis cluster (3 masters), 4 descriptors" "$WORK/four.bin"
stop_floodgate
STATS_PORTS=("$REDIS_PORT")
# --- end Redis Cluster ---

echo
ratio() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f'{a / b:.2f}×' if b else '-')" "$1" "$2"; }
echo "10 descriptors / 1 descriptor, time per request (inverse req/s; target ≤ 2×):" \
    "memory $(ratio "${RPS["memory, 1 descriptor"]}" "${RPS["memory, 10 descriptors"]}")," \
    "redis $(ratio "${RPS["redis, 1 descriptor"]}" "${RPS["redis, 10 descriptors"]}")"

# --- Memory store holding many live buckets; expiry gives the memory back ---------------
# Every key of domain `fill` once (each bucket then lives 2 minutes), then the RSS, then wait
# until the buckets gauge falls back once they have expired (the sweeper runs every 10 s).
start_floodgate memory-fill --memory-max-buckets $((2 * FILL_KEYS))
rss_empty=$(rss_mib)
"$LOADGEN" --addr "http://127.0.0.1:$GRPC_PORT" --domain fill --keys "$FILL_KEYS" \
    --distribution sequential --total "$FILL_KEYS" --warmup 0 --duration 600 \
    >"$WORK/fill.json" 2>"$WORK/fill.err"
deadline=$((SECONDS + 30))
until [ "$(metric floodgate_memory_buckets)" -ge "$FILL_KEYS" ] || [ $SECONDS -ge $deadline ]; do sleep 1; done
live=$(metric floodgate_memory_buckets)
rss_full=$(rss_mib)
deadline=$((SECONDS + 200))
until [ "$(metric floodgate_memory_buckets)" -eq 0 ] || [ $SECONDS -ge $deadline ]; do sleep 2; done
echo "memory store, $FILL_KEYS buckets filled (target: 1 million in ≤ 150 MB RSS):" \
    "$live live buckets, RSS $rss_full MiB (empty: $rss_empty MiB);" \
    "after expiry: $(metric floodgate_memory_buckets) buckets, RSS $(rss_mib) MiB"
stop_floodgate

# --- Redis memory per token bucket ------------------------------------------------------
start_floodgate redis-memory --redis-url "redis://127.0.0.1:$REDIS_PORT/"
"$LOADGEN" --addr "http://127.0.0.1:$GRPC_PORT" --domain fill --keys 1 --connections 1 \
    --streams 1 --total 1 --warmup 0 --duration 10 >/dev/null 2>&1
key='fg:fill:k0=0|tb120'
echo "Redis MEMORY USAGE of one token bucket (target ≤ 80 B): key \`$key\` (${#key} bytes)," \
    "$(redis-cli -p "$REDIS_PORT" object encoding "$key") encoding:" \
    "$(redis-cli -p "$REDIS_PORT" memory usage "$key") B"
stop_floodgate

# --- Side by side with the floor and Limitador, syscalls per request, the script's cost ---
BENCH_BIN=$BIN BENCH_LOADGEN=$LOADGEN bench/side_by_side.sh

echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/{print int($2/1048576)}' /proc/meminfo) GiB, Redis $(redis-server --version | awk '{sub("v=", "", $3); print $3}'), $(h2load --version | head -1)"
