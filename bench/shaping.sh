#!/usr/bin/env bash
# A burst against a shaped limit (max_wait) and against the same limit unshaped, side by side:
# prints when each request was answered and how, and plots the admitted requests over time to
# docs/img/shaping.png (bench/shaping.py, matplotlib from PyPI in .tools/bench-venv).
#
#   bench/shaping.sh                       # Redis store (a redis-server started here)
#   SHAPING_STORE=memory bench/shaping.sh  # the embedded memory store
#   BENCH_BIN=/path/floodgate bench/shaping.sh
#
# The limit: 100 requests per second, a burst of 20; the shaped one holds a request up to
# 2 s for its token. The burst: 200 requests at once (4 HTTP/2 connections × 50 streams to
# POST /json, h2load), 10× the bucket. Unshaped, 20 are admitted and 180 refused; shaped,
# every one is admitted, 20 at once and then one every 10 ms.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh

STORE=${SHAPING_STORE:-redis}
REQUESTS=200
need_h2load
if [ ! -x .tools/bench-venv/bin/python ] || ! .tools/bench-venv/bin/python -c 'import matplotlib' 2>/dev/null; then
    echo "installing matplotlib into .tools/bench-venv"
    python3 -m venv .tools/bench-venv
    .tools/bench-venv/bin/python -m pip install --quiet --disable-pip-version-check 'matplotlib==3.9.*'
fi
TARGET=${CARGO_TARGET_DIR:-target}
if [ -z "${BENCH_BIN:-}" ]; then
    cargo build --profile production --quiet --bin floodgate
fi
BIN=${BENCH_BIN:-$TARGET/production/floodgate}

mkdir "$WORK/limits"
cat > "$WORK/limits/burst.yaml" <<'YAML'
domain: burst
descriptors:
  - {key: shaped, rate_limit: {unit: second, requests_per_unit: 100, burst: 20, max_wait: 2s}}
  - {key: unshaped, rate_limit: {unit: second, requests_per_unit: 100, burst: 20}}
YAML

STORE_ARGS=()
if [ "$STORE" = redis ]; then
    REDIS_PORT=$(free_port)
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
        --logfile "$WORK/redis.log" --daemonize no &
    PIDS+=($!)
    until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.1; done
    STORE_ARGS=(--redis-url "redis://127.0.0.1:$REDIS_PORT")
fi
GRPC_PORT=$(free_port); HTTP_PORT=$(free_port)
RUST_LOG=warn "$BIN" serve --config "$WORK/limits" --grpc-addr "127.0.0.1:$GRPC_PORT" \
    --http-addr "127.0.0.1:$HTTP_PORT" "${STORE_ARGS[@]}" >"$WORK/floodgate.log" 2>&1 &
PIDS+=($!)
until curl -sf "127.0.0.1:$HTTP_PORT/healthcheck" >/dev/null; do sleep 0.1; done

for kind in unshaped shaped; do
    printf '{"domain":"burst","descriptors":[{"entries":[{"key":"%s","value":"v"}]}]}' \
        "$kind" > "$WORK/$kind.json"
    h2load -n "$REQUESTS" -c 4 -m 50 -t 1 -d "$WORK/$kind.json" \
        -H 'content-type: application/json' --log-file "$WORK/$kind.log" \
        "http://127.0.0.1:$HTTP_PORT/json" >"$WORK/$kind.h2load" 2>&1
    # Let the bucket fill up again before the other burst.
    sleep 2.5
done

echo "floodgate $(git rev-parse --short HEAD), $STORE store, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
.tools/bench-venv/bin/python bench/shaping.py "$WORK/unshaped.log" "$WORK/shaped.log" \
    docs/img/shaping.png "$STORE"
