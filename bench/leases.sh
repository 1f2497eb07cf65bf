#!/usr/bin/env bash
# Leases on one hot bucket: OK answers per second and Redis script calls per OK answer, with
# leases on (--lease-fraction, default 0.1) and off (--lease-fraction 0), in the same run on
# the same Redis.
#
#   bench/leases.sh [BIN]                     # default target/release/floodgate
#   LEASE_REQUESTS=500000 LEASE_ROUNDS=3 bench/leases.sh
#   LEASE_ARGS="--redis-timeout-ms 1000" bench/leases.sh   # a loaded machine: no misses
#
# The load is h2load on one descriptor (domain `one` of bench/common.sh: 10^6 per second, one
# value, so one bucket) with 16 connections × 8 streams. Counted per run: OK answers from
# floodgate_requests_total{result="ok"} (never h2load's req/s, which counts errors too), the
# answers that were not OK, script calls from Redis's INFO commandstats (EVALSHA + EVAL), and
# h2load's wall time. Each run starts a fresh server on a flushed Redis with reset stats.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
need_h2load
BIN=${1:-target/release/floodgate}
[ -x "$BIN" ] || { echo "no binary at $BIN (cargo build --release, or pass one)"; exit 2; }
REQUESTS=${LEASE_REQUESTS:-200000}
WARMUP=${LEASE_WARMUP:-20000}
ROUNDS=${LEASE_ROUNDS:-1}
read -r -a EXTRA <<<"${LEASE_ARGS:-}"

write_side_by_side_limits
start_redis

# run FRACTION : prints "ok_per_s calls_per_ok not_ok" for one fresh server.
run() {
    local fraction=$1 grpc http pid
    grpc=$(free_port); http=$(free_port)
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    RUST_LOG=warn "$BIN" serve --config "$WORK/limits" --grpc-addr "127.0.0.1:$grpc" \
        --http-addr "127.0.0.1:$http" --redis-url "redis://127.0.0.1:$REDIS_PORT/" \
        --lease-fraction "$fraction" "${EXTRA[@]}" >"$WORK/server.log" 2>&1 &
    pid=$!
    until curl -sf "127.0.0.1:$http/healthcheck" >/dev/null; do sleep 0.1; done
    local url="http://127.0.0.1:$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    local h2=(h2load -c 16 -m 8 -t 1 -H 'content-type: application/grpc' -H 'te: trailers'
              --data "$WORK/one.bin")
    "${h2[@]}" -n "$WARMUP" "$url" >/dev/null 2>&1
    local ok0 calls0
    ok0=$(ok_answers "$http")
    calls0=$(script_calls)
    "${h2[@]}" -n "$REQUESTS" "$url" >"$WORK/h2.out" 2>&1
    local ok1 calls1 all secs failed
    ok1=$(ok_answers "$http")
    calls1=$(script_calls)
    all=$(curl -s "127.0.0.1:$http/metrics" | awk '$1 ~ /^floodgate_requests_total/ { s += $2 } END { print s + 0 }')
    kill "$pid"; wait "$pid" 2>/dev/null || true
    secs=$(sed -n 's/^finished in \([0-9.]*\)s,.*/\1/p' "$WORK/h2.out")
    failed=$(sed -n 's/.* succeeded, \([0-9]*\) failed, \([0-9]*\) errored.*/\1 \2/p' "$WORK/h2.out" |
        awk '{print $1 + $2}')
    python3 - "$ok0" "$ok1" "$calls0" "$calls1" "$secs" "$all" "$failed" <<'PY'
import sys
ok0, ok1, c0, c1, secs, all_, failed = (float(x or 0) for x in sys.argv[1:])
ok = ok1 - ok0
print(f"{ok / secs if secs else 0:.0f} {(c1 - c0) / ok if ok else float('nan'):.4f} "
      f"{int(all_ - ok1 + failed)}")
PY
}

ok_answers() {
    curl -s "127.0.0.1:$1/metrics" | awk '$1 ~ /^floodgate_requests_total/ && $1 ~ /result="ok"/ { s += $2 } END { print s + 0 }'
}

script_calls() {
    redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' |
        awk -F'[:=,]' '$1 == "cmdstat_evalsha" || $1 == "cmdstat_eval" { s += $3 } END { print s + 0 }'
}

echo "| round | --lease-fraction | OK/s | script calls per OK | not OK |"
echo "|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
    for fraction in 0.1 0; do
        read -r rate per bad < <(run "$fraction")
        echo "| $round | $fraction | $rate | $per | $bad |"
    done
done
