#!/usr/bin/env bash
# Benchmarks floodgate with h2load (HTTP/2, gRPC framing) and prints a markdown table.
#
#   bench/run.sh                 # 10 s per scenario after 2 s of warm-up
#   BENCH_SECONDS=30 bench/run.sh
#
# Scenarios: the no-store path (unknown domain: plan only), the memory store and the Redis
# store with 1 and 4 descriptors per request. Load: 16 connections × 8 concurrent streams,
# one h2load thread, all on loopback. Limits are large, so every request is fully evaluated
# and admitted. "EVALSHA/req" counts the script calls Redis received per request.
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
BIN=target/release/floodgate
WORK=$(mktemp -d)
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$WORK"; }
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
    GRPC_PORT=$(free_port); local http_port; http_port=$(free_port)
    RUST_LOG=warn "$BIN" serve --config "$WORK/limits.yaml" \
        --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$http_port" "$@" \
        >"$WORK/$name.log" 2>&1 &
    FG_PID=$!; PIDS+=("$FG_PID")
    until curl -sf "127.0.0.1:$http_port/healthcheck" >/dev/null; do sleep 0.1; done
}

# run NAME BODY : one h2load run against GRPC_PORT; prints a table row.
run() {
    local name=$1 body=$2
    local before=0 after=0
    before=$(redis-cli -p "$REDIS_PORT" info commandstats | awk -F'[=,:]' '/^cmdstat_evalsha:/{print $3}')
    before=${before:-0}
    h2load --warm-up-time="$WARMUP" -D "$SECONDS_PER_RUN" -c "$CONNECTIONS" -m "$STREAMS" -t 1 \
        --data "$body" -H 'content-type: application/grpc' -H 'te: trailers' \
        --log-file "$WORK/$name.h2log" \
        "http://127.0.0.1:$GRPC_PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
        >"$WORK/$name.h2load" 2>&1
    after=$(redis-cli -p "$REDIS_PORT" info commandstats | awk -F'[=,:]' '/^cmdstat_evalsha:/{print $3}')
    after=${after:-0}
    local rps; rps=$(awk '/^finished in/{gsub(",","",$4); print $4}' "$WORK/$name.h2load")
    read -r count p50 p99 p999 bad < <(python3 bench/latency.py "$WORK/$name.h2log")
    local rss; rss=$(awk '/VmRSS/{print int($2/1024)}' "/proc/$FG_PID/status")
    local per_req
    per_req=$(python3 -c "b,a,c=$before,$after,$count; print(f'{(a-b)/c:.2f}' if c and a-b else '0')")
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$rps" "$p50" "$p99" "$p999" "$per_req" "$bad" "$rss"
}

echo
echo "| scenario | req/s | p50 ms | p99 ms | p999 ms | EVALSHA/req | non-2xx | floodgate RSS MiB |"
echo "|---|---|---|---|---|---|---|---|"
start_floodgate memory
run "no store (unknown domain)" "$WORK/noop.bin"
run "memory, 1 descriptor" "$WORK/one.bin"
run "memory, 4 descriptors" "$WORK/four.bin"
kill "$FG_PID"; wait "$FG_PID" 2>/dev/null || true
start_floodgate redis --redis-url "redis://127.0.0.1:$REDIS_PORT/"
run "redis, 1 descriptor" "$WORK/one.bin"
run "redis, 4 descriptors" "$WORK/four.bin"
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/{print int($2/1048576)}' /proc/meminfo) GiB, $(redis-server --version | awk '{print $3}'), $(h2load --version | head -1)"
