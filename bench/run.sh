#!/usr/bin/env bash
# Benchmarks floodgate with h2load (HTTP/2, gRPC framing) and prints a markdown table.
#
#   bench/run.sh                 # 10 s per scenario after 2 s of warm-up
#   BENCH_SECONDS=30 bench/run.sh
#
# Scenarios: the no-store path (unknown domain: plan only), the memory store and the Redis
# store with 1 and 4 descriptors per request. Load: 16 connections × 8 concurrent streams
# (closed loop: a new request as soon as one is answered), one h2load thread, all on
# loopback; plus a light-load row (4 connections × 1 stream). Limits are large, so every request is fully evaluated
# and admitted. "EVALSHA/req" counts the script calls Redis received per request, "Redis µs/call"
# the time Redis spent per script call (INFO commandstats); "floodgate CPU %" is its user +
# system time over the run (warm-up included) as % of one core, and "CPU µs/req" that time per
# request it answered — the figure to compare optimisations by on a noisy machine; "errors"
# counts requests floodgate did not answer OK (from its /metrics: gRPC errors travel in HTTP/2
# trailers with HTTP status 200, which h2load cannot see).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN=${BENCH_SECONDS:-10}
WARMUP=${BENCH_WARMUP:-2}
CONNECTIONS=16
STREAMS=8

command -v h2load >/dev/null || {
    echo "installing nghttp2-client (h2load)"
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq && $sudo apt-get install -y -qq nghttp2-client >/dev/null
}
scripts/install-test-tools.sh >/dev/null

cargo build --release --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/floodgate
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

cat > "$WORK/limits.yaml" <<'YAML'
domain: bench
descriptors:
  - {key: k0, rate_limit: {unit: hour, requests_per_unit: 1000000000}}
  - {key: k1, rate_limit: {unit: hour, requests_per_unit: 1000000000}}
  - {key: k2, rate_limit: {unit: hour, requests_per_unit: 1000000000}}
  - {key: k3, rate_limit: {unit: hour, requests_per_unit: 1000000000}}
YAML
python3 bench/grpc_body.py nobody 1 "$WORK/noop.bin"
python3 bench/grpc_body.py bench 1 "$WORK/one.bin"
python3 bench/grpc_body.py bench 4 "$WORK/four.bin"

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --logfile "$WORK/redis.log" --daemonize no &
PIDS+=($!)
until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.1; done

# start_floodgate NAME ARGS... : starts a server, sets GRPC_PORT and FG_PID.
start_floodgate() {
    local name=$1; shift
    GRPC_PORT=$(free_port); HTTP_PORT=$(free_port)
    RUST_LOG=warn "$BIN" serve --config "$WORK/limits.yaml" \
        --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$HTTP_PORT" "$@" \
        >"$WORK/$name.log" 2>&1 &
    FG_PID=$!; PIDS+=("$FG_PID")
    until curl -sf "127.0.0.1:$HTTP_PORT/healthcheck" >/dev/null; do sleep 0.1; done
}

# evalsha_stats : Redis's EVALSHA calls so far and the µs it spent in them.
evalsha_stats() {
    redis-cli -p "$REDIS_PORT" info commandstats |
        awk -F'[=,:]' '/^cmdstat_evalsha:/{print $3, $5; found=1} END {if (!found) print 0, 0}'
}

# cpu_ticks PID : user + system CPU time of PID, in clock ticks.
TICKS=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# answered KIND : floodgate's count of requests with result KIND (ok, store_error, ...).
answered() {
    curl -s "127.0.0.1:$HTTP_PORT/metrics" |
        awk -v k="$1" '$1 == "floodgate_requests_total{result=\""k"\"}" {print $2; found=1} END {if (!found) print 0}'
}

# run NAME BODY [CONNECTIONS STREAMS] : one h2load run against GRPC_PORT; prints a table row.
run() {
    local name=$1 body=$2 c=${3:-$CONNECTIONS} m=${4:-$STREAMS}
    local before=0 after=0
    read -r before usec_before < <(evalsha_stats)
    local ok_before; ok_before=$(answered ok)
    local all_before; all_before=$(curl -s "127.0.0.1:$HTTP_PORT/metrics" | awk '/^floodgate_requests_total/{s+=$2} END{print s+0}')
    local cpu_before; cpu_before=$(cpu_ticks "$FG_PID")
    local t_before; t_before=$(date +%s.%N)
    h2load --warm-up-time="$WARMUP" -D "$SECONDS_PER_RUN" -c "$c" -m "$m" -t 1 \
        --data "$body" -H 'content-type: application/grpc' -H 'te: trailers' \
        --log-file "$WORK/$name.h2log" \
        "http://127.0.0.1:$GRPC_PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
        >"$WORK/$name.h2load" 2>&1
    local t_after; t_after=$(date +%s.%N)
    local cpu_after; cpu_after=$(cpu_ticks "$FG_PID")
    read -r after usec_after < <(evalsha_stats)
    local ok_after; ok_after=$(answered ok)
    local all_after; all_after=$(curl -s "127.0.0.1:$HTTP_PORT/metrics" | awk '/^floodgate_requests_total/{s+=$2} END{print s+0}')
    local errors=$(( (all_after - all_before) - (ok_after - ok_before) ))
    local rps; rps=$(awk '/^finished in/{gsub(",","",$4); print $4}' "$WORK/$name.h2load")
    read -r count p50 p99 p999 bad < <(python3 bench/latency.py "$WORK/$name.h2log")
    local rss; rss=$(awk '/VmRSS/{print int($2/1024)}' "/proc/$FG_PID/status")
    local per_req
    # Per request floodgate answered (h2load's log leaves out the warm-up requests).
    per_req=$(python3 -c "b,a,c=$before,$after,$((all_after - all_before)); print(f'{(a-b)/c:.2f}' if c and a-b else '0')")
    local redis_us
    redis_us=$(python3 -c "n=$after-$before; print(f'{($usec_after-$usec_before)/n:.1f}' if n else '-')")
    # floodgate's CPU over the run (warm-up included) as % of one core, and per request answered.
    local cpu
    cpu=$(python3 -c "t=($cpu_after-$cpu_before)/$TICKS; w=$t_after-$t_before; c=$((all_after - all_before)); print(f'{100*t/w:.0f} | {1e6*t/c:.1f}' if c else f'{100*t/w:.0f} | -')")
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$rps" "$p50" "$p99" "$p999" "$per_req" "$redis_us" "$((errors + bad))" "$cpu" "$rss"
}

echo
echo "| scenario | req/s | p50 ms | p99 ms | p999 ms | EVALSHA/req | Redis µs/call | errors | floodgate CPU % | CPU µs/req | floodgate RSS MiB |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
start_floodgate memory
run "no store (unknown domain)" "$WORK/noop.bin"
run "memory, 1 descriptor" "$WORK/one.bin"
run "memory, 4 descriptors" "$WORK/four.bin"
kill "$FG_PID"; wait "$FG_PID" 2>/dev/null || true
start_floodgate redis --redis-url "redis://127.0.0.1:$REDIS_PORT/"
run "redis, 1 descriptor" "$WORK/one.bin"
run "redis, 4 descriptors" "$WORK/four.bin"
run "redis, 1 descriptor, light load (4 × 1)" "$WORK/one.bin" 4 1
kill "$FG_PID"; wait "$FG_PID" 2>/dev/null || true
# The same with a 1 s Redis deadline: raw capacity, no request cut off at saturation.
start_floodgate redis-slow --redis-url "redis://127.0.0.1:$REDIS_PORT/" --redis-timeout-ms 1000
run "redis, 1 descriptor, 1 s deadline" "$WORK/one.bin"
run "redis, 4 descriptors, 1 s deadline" "$WORK/four.bin"

# --- Redis Cluster (3 masters): one EVALSHA per hash slot a request touches, in parallel. ---
# Self-contained: its own nodes, and evalsha_stats redefined to sum over the masters.
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
evalsha_stats() {
    for port in "${CLUSTER_PORTS[@]}"; do redis-cli -p "$port" info commandstats; done |
        awk -F'[=,:]' '/^cmdstat_evalsha:/{calls += $3; usec += $5} END {print calls + 0, usec + 0}'
}
SEEDS=$(printf 'redis://127.0.0.1:%s,' "${CLUSTER_PORTS[@]}")
start_floodgate cluster --redis-cluster "${SEEDS%,}"
run "redis cluster (3 masters), 1 descriptor" "$WORK/one.bin"
run "redis cluster (3 masters), 4 descriptors" "$WORK/four.bin"
kill "$FG_PID"; wait "$FG_PID" 2>/dev/null || true
# --- end Redis Cluster ---
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/{print int($2/1048576)}' /proc/meminfo) GiB, Redis $(redis-server --version | awk '{sub("v=", "", $3); print $3}'), $(h2load --version | head -1)"
