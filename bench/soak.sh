#!/usr/bin/env bash
# Soak: the release binary with Redis at a fixed request rate, keys changing every interval,
# sampling floodgate's RSS and open file descriptors; prints every sample and a summary
# (start, middle, end, min, max). Flat RSS and fd counts mean no leak.
#
#   bench/soak.sh                          # 10 minutes at 18000 req/s, a sample every 5 s
#   SOAK_SECONDS=60 SOAK_RPS=15000 bench/soak.sh
#
# 18000 req/s is about half the Redis capacity (36.8k req/s, 1 descriptor) measured by
# bench/run.sh on the 2-core machine (docs/performance.md). Load: h2load, 16 connections, `--rps` per connection; every interval
# a new h2load run sends a new request body whose descriptor values carry the interval
# number, so new buckets are created all along and old ones expire.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh

DURATION=${SOAK_SECONDS:-600}
RPS=${SOAK_RPS:-18000}
INTERVAL=${SOAK_INTERVAL:-5}
CONNECTIONS=16

need_h2load
command -v redis-server >/dev/null || scripts/install-test-tools.sh
cargo build --profile production --quiet --bin floodgate
BIN=${CARGO_TARGET_DIR:-target}/production/floodgate

# One interval's hits (RPS × INTERVAL per value) stay well within a bucket, which then refills
# and expires from Redis within a minute: new keys all along, old ones leaving.
cat > "$WORK/limits.yaml" <<'YAML'
domain: soak
descriptors:
  - {key: k0, rate_limit: {unit: minute, requests_per_unit: 10000000}}
  - {key: k1, rate_limit: {unit: minute, requests_per_unit: 10000000}}
YAML

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --logfile "$WORK/redis.log" &
PIDS+=($!)
until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.1; done
GRPC_PORT=$(free_port); HTTP_PORT=$(free_port)
RUST_LOG=warn "$BIN" serve --config "$WORK/limits.yaml" --redis-url "redis://127.0.0.1:$REDIS_PORT/" \
    --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$HTTP_PORT" >"$WORK/floodgate.log" 2>&1 &
FG_PID=$!; PIDS+=("$FG_PID")
until curl -sf "127.0.0.1:$HTTP_PORT/healthcheck" >/dev/null; do
    kill -0 "$FG_PID" 2>/dev/null || { cat "$WORK/floodgate.log"; exit 1; }
    sleep 0.1
done

sample() { # elapsed-seconds req/s rss-KiB fds
    echo "$1 $2 $(awk '/VmRSS/{print $2}' "/proc/$FG_PID/status") $(ls "/proc/$FG_PID/fd" | wc -l)"
}
requests() { # ShouldRateLimit calls answered, by result
    curl -s "127.0.0.1:$HTTP_PORT/metrics" | awk '/^floodgate_requests_total/{print}'
}

echo "soak: ${DURATION}s at ${RPS} req/s with Redis, keys changing every ${INTERVAL}s"
start=$(date +%s)
sample 0 0 >"$WORK/samples"
i=0
while [ $(( $(date +%s) - start )) -lt "$DURATION" ]; do
    python3 bench/grpc_body.py soak 2 "$WORK/body.bin" "i$i"
    h2load -D "$INTERVAL" -c "$CONNECTIONS" -m 1 -t 1 --rps=$(( RPS / CONNECTIONS )) \
        --data "$WORK/body.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
        "http://127.0.0.1:$GRPC_PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
        >"$WORK/h2load.out" 2>&1 &
    H2LOAD=$!
    # Sampled mid-interval, while the load's connections are open.
    sleep $(( INTERVAL / 2 ))
    mid=$(( $(date +%s) - start ))
    rss_fds=$(sample "$mid" 0 | cut -d' ' -f3-)
    wait "$H2LOAD"
    rate=$(awk '/^finished in/{gsub(",","",$4); print int($4)}' "$WORK/h2load.out")
    echo "$mid ${rate:-0} $rss_fds" >>"$WORK/samples"
    i=$((i + 1))
done

echo
echo "| t (s) | req/s (interval) | RSS MiB | open fds |"
echo "|---|---|---|---|"
awk '{printf "| %d | %d | %.1f | %d |\n", $1, $2, $3 / 1024, $4}' "$WORK/samples"
echo
python3 - "$WORK/samples" <<'PY'
import sys
rows = [tuple(map(int, line.split())) for line in open(sys.argv[1])]
idle, rows = rows[0], rows[1:] or rows  # the summary is over samples taken under load
rss = [r[2] / 1024 for r in rows]
fds = [r[3] for r in rows]
mid = len(rows) // 2
print("| | start | middle | end | min | max |")
print("|---|---|---|---|---|---|")
print(f"| RSS MiB | {rss[0]:.1f} | {rss[mid]:.1f} | {rss[-1]:.1f} | {min(rss):.1f} | {max(rss):.1f} |")
print(f"| open fds | {fds[0]} | {fds[mid]} | {fds[-1]} | {min(fds)} | {max(fds)} |")
print(f"\nunder load: mean {sum(r[1] for r in rows) / len(rows):.0f} req/s over {len(rows)} intervals; "
      f"before load: RSS {idle[2] / 1024:.1f} MiB, {idle[3]} fds")
PY
echo
requests
echo "Redis keys at the end: $(redis-cli -p "$REDIS_PORT" dbsize)"
echo "last interval: $(grep -E '^finished in|^requests:' "$WORK/h2load.out" | tr '\n' ' ')"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), Redis $(redis-server --version | awk '{sub("v=", "", $3); print $3}')"
