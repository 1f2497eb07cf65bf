#!/usr/bin/env bash
# Overload: what floodgate and Limitador answer past Redis's capacity. Every figure counts OK
# answers only and says beside it how many were not OK.
#
#   bench/overload.sh                                   # both parts, production build
#   OVL_RATES="20000 50000 100000 150000" OVL_SECONDS=10 bench/overload.sh
#   OVL_PARTS=open bench/overload.sh                    # one part: open, capped or closed
#   OVL_PARTS=capped OVL_CAPACITY=1000 OVL_SECONDS=10 bench/overload.sh
#       # open loop past the store's capacity: Redis capped at 1,000 commands a second
#   BENCH_BIN=/path/floodgate LOADGEN_BIN=/path/loadgen LIMITADOR_BIN=/path/limitador-server \
#       bench/overload.sh
#   OVL_PARTS=closed OVL_SECONDS=3 OVL_REPEATS=3 OVL_DESCRIPTORS=4 \
#       OVL_BINS="/path/a/floodgate /path/b/floodgate" bench/overload.sh   # closed-loop A/B
#   FLOODGATE_LEASE_FRACTION=0 OVL_PARTS=closed OVL_SECONDS=3 OVL_REPEATS=2 \
#       OVL_BINS="/path/a/floodgate /path/b/floodgate" bench/overload.sh   # the same, leases off
#       # (the server reads its settings from the environment too)
#   OVL_GRPC_TIMEOUT=20m OVL_PARTS=closed bench/overload.sh   # clients send Envoy's deadline
#   OVL_LOADGEN_THREADS=8 OVL_CONNECTIONS=64 OVL_LIMITADOR_MAX_RATE=150000 bench/overload.sh
#       # a many-core machine: a load generator that keeps its schedule at high rates, and
#       # Limitador (which queues without bound) only up to a rate it can drain
#
# 1. Open loop (examples/loadgen --rps: requests leave on schedule whether or not earlier
#    ones were answered, as an Envoy fleet's do; latency from the scheduled time), one
#    descriptor, OVL_KEYS distinct values drawn uniformly (many keys), Redis, a fresh server
#    per row. Columns: offered load, OK/s, not OK/s (floodgate: shed before Redis in
#    brackets; Limitador: gRPC errors), p50 and p99 in ms of all answers. Both servers'
#    answers are counted by gRPC status and code by loadgen.
# 1b. Open loop past the *store's* capacity (OVL_PARTS=capped): Redis behind
#    bench/capped_redis.py, which runs at most OVL_CAPACITY commands a second (default
#    1,000) in arrival order, so the store saturates long before the host does and its
#    latency grows as a saturated Redis's. Offered OVL_LOADS times that (default 0.5 1 1.5 3
#    10), open loop, many keys, each request with a deadline of OVL_CAPPED_TIMEOUT_MS
#    (default 20, Envoy's default rate-limit timeout; "none" for none), a fresh server and
#    stand-in per row: floodgate with the default failure policy, floodgate with
#    `--on-store-error local`, and Limitador. Columns: offered/s, OK/s, not OK/s (floodgate:
#    shed before Redis in brackets), of the OK answers those decided locally (by the local
#    policy, floodgate_local_decisions_total), p50 and p99 in ms of the OK answers alone. The
#    goal: from 1.5x on, OK/s decided by Redis >= 0.9x the peak, their p99 within the Redis
#    deadline (10 ms) plus the queue wait their deadline allows, the rest answered at once.
#    The cap counts requests (`capped_redis.py --per-request`: an EVALSHA carrying several
#    merged requests takes one turn per request), so the store's capacity in requests is
#    fixed whatever floodgate merges; OVL_CAPPED_UNIT=commands counts commands instead, where
#    merging lifts the requests served. Limitador sends two commands per request (MGET,
#    then EVALSHA), so through the stand-in its capacity is half as many requests.
# 2. Closed loop (h2load, the rows of the issue): 128, 512 and 1,024 calls in flight, 1 and 4
#    descriptors, Redis, floodgate; OK/s from floodgate_requests_total{result="ok"} (h2load
#    cannot see gRPC status in trailers), not OK beside it; then 128 again 2 s after the
#    1,024 run, on the same server. The goal: 512 and 1,024 keep >= 0.6x and >= 0.5x of the
#    OK/s at 128, and the run 2 s after is back to >= 0.9x. h2load sends no `grpc-timeout`
#    unless OVL_GRPC_TIMEOUT gives one (Envoy sends its filter's timeout, 20m by default).
#    OVL_BINS names several binaries: each repeat (OVL_REPEATS, default 1) runs the rows on
#    each in turn, alternated, so that a machine whose speed drifts affects them alike; the
#    ratios of one run are the figures to compare. OVL_CLOSED_ROWS sets the rows (default
#    "128 512 1024 128+2"; N+S: N in flight, S seconds after the run before; "128 128 128
#    128+2" is the control without the overload). Beside each row, counts per OK answer,
#    which a loaded machine's speed does not change: script calls and Redis's own µs per
#    call (INFO commandstats), the share answered from leases alone, requests sent to Redis
#    and leases taken per 1,000 OK answers, tokens per lease, floodgate's and Redis's CPU
#    per OK answer; and the mean store call, the RSS, the bound and the not-OK answers by
#    kind, and the connections Redis accepted during the run (each call that misses its
#    deadline retires its connection; FLOODGATE_REDIS_TIMEOUT_MS=200 removes the timeouts a
#    loaded host causes).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
need_h2load
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

RATES=${OVL_RATES:-"20000 50000 100000 150000 300000"}
CAPACITY=${OVL_CAPACITY:-1000}
CAPPED_UNIT=${OVL_CAPPED_UNIT:-requests}
CAPPED_FLAGS=()
[ "$CAPPED_UNIT" = requests ] && CAPPED_FLAGS=(--per-request)
LOADS=${OVL_LOADS:-"0.5 1 1.5 3 10"}
CAPPED_TIMEOUT_MS=${OVL_CAPPED_TIMEOUT_MS:-20}
SECONDS_PER_RUN=${OVL_SECONDS:-10}
KEYS=${OVL_KEYS:-100000}
PARTS=${OVL_PARTS:-"open closed"}
REPEATS=${OVL_REPEATS:-1}
DESCRIPTORS=${OVL_DESCRIPTORS:-"1 4"}
GRPC_TIMEOUT=${OVL_GRPC_TIMEOUT:-}
CLOSED_ROWS=${OVL_CLOSED_ROWS:-"128 512 1024 128+2"}
TARGET=${CARGO_TARGET_DIR:-target}
if [ -z "${OVL_BINS:-}" ] && { [ -z "${BENCH_BIN:-}" ] || [ -z "${LOADGEN_BIN:-}" ]; }; then
    cargo build --profile production --quiet --bin floodgate --example loadgen
fi
BIN=${BENCH_BIN:-$TARGET/production/floodgate}
BINS=${OVL_BINS:-$BIN}
LOADGEN=${LOADGEN_BIN:-$TARGET/production/examples/loadgen}

LIMITADOR=
[[ " $PARTS " == *" open "* || " $PARTS " == *" capped "* ]] && find_limitador

# Domains `one` (k0) and `four` (k0..k3), 10^6 per second per value: nothing is over limit,
# so every answer that is not OK is the server's failure to answer in time.
write_side_by_side_limits

start_redis

# start SERVER [PORT [FLAGS...]] : floodgate or limitador on the Redis at PORT (default
# $REDIS_PORT; flushed), floodgate with FLAGS; sets GRPC_PORT, HTTP_PORT, SRV_PID.
start() {
    local server=$1 port=${2:-$REDIS_PORT}
    shift; [ $# -gt 0 ] && shift
    GRPC_PORT=$(free_port); HTTP_PORT=$(free_port)
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    if [ "$server" = floodgate ]; then
        RUST_LOG=warn "$BIN" serve --config "$WORK/limits" --grpc-addr "127.0.0.1:$GRPC_PORT" \
            --http-addr "127.0.0.1:$HTTP_PORT" --redis-url "redis://127.0.0.1:$port/" "$@" \
            >"$WORK/server.log" 2>&1 &
        SRV_PID=$!
        until curl -sf "127.0.0.1:$HTTP_PORT/healthcheck" >/dev/null; do sleep 0.1; done
    else
        "$LIMITADOR" -b 127.0.0.1 -p "$GRPC_PORT" -B 127.0.0.1 -P "$HTTP_PORT" \
            "$WORK/limitador.yaml" redis "redis://127.0.0.1:$port" >"$WORK/server.log" 2>&1 &
        SRV_PID=$!
        until python3 -c "import socket; socket.create_connection(('127.0.0.1', $GRPC_PORT), 0.2)" 2>/dev/null; do sleep 0.1; done
    fi
    PIDS+=("$SRV_PID")
}
stop() { kill "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true; }

# floodgate's answers so far: "ok not_ok shed".
answers() {
    curl -s "127.0.0.1:$HTTP_PORT/metrics" | awk '
        $1 ~ /^floodgate_requests_total/ { all += $2; if ($1 ~ /result="ok"/) ok += $2 }
        $1 == "floodgate_store_errors_total{kind=\"shed\"}" { shed += $2 }
        END { print ok + 0, all - ok, shed + 0 }'
}

# floodgate's answers decided locally so far (--on-store-error local).
local_answers() {
    curl -s "127.0.0.1:$HTTP_PORT/metrics" | awk '
        $1 ~ /^floodgate_local_decisions_total/ { n += $2 } END { print n + 0 }'
}

if [[ " $PARTS " == *" open "* ]]; then
    echo
    echo "## Open loop: offered load, 1 descriptor, $KEYS keys uniform, Redis, ${SECONDS_PER_RUN} s per row"
    echo
    echo "| server | offered/s | sent/s | OK/s | not OK/s (shed) | p50 ms | p99 ms |"
    echo "|---|---|---|---|---|---|---|"
    SERVERS=(floodgate)
    [ -n "$LIMITADOR" ] && SERVERS+=(limitador)
    for rate in $RATES; do
        for server in "${SERVERS[@]}"; do
            [ "$server" = limitador ] && [ "$rate" -gt "${OVL_LIMITADOR_MAX_RATE:-1000000000}" ] && continue
            start "$server"
            shed0=0
            [ "$server" = floodgate ] && read -r _ _ shed0 < <(answers)
            "$LOADGEN" --addr "http://127.0.0.1:$GRPC_PORT" --domain one --connections "${OVL_CONNECTIONS:-16}" \
                --rps "$rate" --keys "$KEYS" --descriptors 1 --duration "$SECONDS_PER_RUN" \
                --warmup 2 --threads "${OVL_LOADGEN_THREADS:-2}" >"$WORK/loadgen.json" 2>"$WORK/loadgen.err" || true
            shed=-
            if [ "$server" = floodgate ]; then
                read -r _ _ shed1 < <(answers)
                shed=$((shed1 - shed0))
            fi
            stop
            python3 - "$WORK/loadgen.json" "$server" "$rate" "$shed" "$SECONDS_PER_RUN" <<'PY'
import json, sys
path, server, rate, shed, seconds = sys.argv[1:]
try:
    r = json.loads(open(path).read().strip().splitlines()[-1])
except (IndexError, ValueError):
    print(f"| {server} | {rate} | (loadgen failed) | | | | |")
    sys.exit()
s = r["seconds"] or float(seconds)
ok = r["answers"].get("ok", 0) / s
not_ok = (r["requests"] - r["answers"].get("ok", 0)) / s
shed = f" ({int(shed) / s:.0f})" if shed != "-" else ""
sent = r["requests"] / s
print(f"| {server} | {rate} | {sent:.0f} | {ok:.0f} | {not_ok:.0f}{shed} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |")
PY
        done
    done
fi

if [[ " $PARTS " == *" capped "* ]]; then
    deadline_text="$CAPPED_TIMEOUT_MS ms"
    [ "$CAPPED_TIMEOUT_MS" = none ] && deadline_text=none
    echo
    echo "## Open loop past the store's capacity: Redis capped at $CAPACITY $CAPPED_UNIT/s (bench/capped_redis.py), 1 descriptor, $KEYS keys uniform, client deadline: $deadline_text, ${SECONDS_PER_RUN} s per row"
    echo
    echo "| server | load | offered/s | sent/s | OK/s | not OK/s (shed) | of OK, decided locally/s | p50 OK ms | p99 OK ms |"
    echo "|---|---|---|---|---|---|---|---|---|"
    timeout_flag=()
    [ "$CAPPED_TIMEOUT_MS" != none ] && timeout_flag=(--grpc-timeout-ms "$CAPPED_TIMEOUT_MS")
    SERVERS=(floodgate floodgate-local)
    [ -n "$LIMITADOR" ] && SERVERS+=(limitador)
    for load in $LOADS; do
        rate=$(python3 -c "print(round($load * $CAPACITY))")
        for server in "${SERVERS[@]}"; do
            # A fresh stand-in per row: what one row left queued in it does not slow the next.
            CAPPED_PORT=$(free_port)
            python3 bench/capped_redis.py --port "$CAPPED_PORT" --upstream-port "$REDIS_PORT" \
                --capacity "$CAPACITY" "${CAPPED_FLAGS[@]}" 2>>"$WORK/capped.log" &
            CAPPED_PID=$!
            PIDS+=("$CAPPED_PID")
            until redis-cli -p "$CAPPED_PORT" ping >/dev/null 2>&1; do sleep 0.1; done
            case $server in
                floodgate) start floodgate "$CAPPED_PORT" ;;
                floodgate-local) start floodgate "$CAPPED_PORT" --on-store-error local ;;
                limitador) start limitador "$CAPPED_PORT" ;;
            esac
            "$LOADGEN" --addr "http://127.0.0.1:$GRPC_PORT" --domain one --connections "${OVL_CONNECTIONS:-16}" \
                --rps "$rate" --keys "$KEYS" --descriptors 1 --duration "$SECONDS_PER_RUN" \
                --warmup 2 --threads "${OVL_LOADGEN_THREADS:-2}" "${timeout_flag[@]}" \
                >"$WORK/loadgen.json" 2>"$WORK/loadgen.err" &
            LOADGEN_PID=$!
            # The server's counters from the end of the warm-up (loadgen connects, then warms
            # up for 2 s): about the window loadgen measures.
            sleep 2.2
            shed0=0; local0=0
            [ "$server" != limitador ] && { read -r _ _ shed0 < <(answers); local0=$(local_answers); }
            wait "$LOADGEN_PID" || true
            shed=-; locally=-
            if [ "$server" != limitador ]; then
                read -r _ _ shed1 < <(answers)
                shed=$((shed1 - shed0))
                locally=$(( $(local_answers) - local0 ))
            fi
            stop
            kill "$CAPPED_PID"; wait "$CAPPED_PID" 2>/dev/null || true
            python3 - "$WORK/loadgen.json" "$server" "$load" "$rate" "$shed" "$locally" "$SECONDS_PER_RUN" <<'PY'
import json, sys
path, server, load, rate, shed, locally, seconds = sys.argv[1:]
try:
    r = json.loads(open(path).read().strip().splitlines()[-1])
except (IndexError, ValueError):
    print(f"| {server} | {load}C | {rate} | (loadgen failed) | | | | | |")
    sys.exit()
s = r["seconds"] or float(seconds)
ok = r["answers"].get("ok", 0) / s
not_ok = (r["requests"] - r["answers"].get("ok", 0)) / s
# From the server's counters over about the measured window (read from the end of the
# warm-up to loadgen's end): a rate, not an exact count of loadgen's requests.
shed = f" ({int(shed) / s:.0f})" if shed != "-" else ""
locally = f"{int(locally) / s:.0f}" if locally != "-" else "-"
ms = lambda v: "-" if v is None else f"{v:.2f}"
print(f"| {server} | {load}C | {rate} | {r['requests'] / s:.0f} | {ok:.0f} | {not_ok:.0f}{shed} | {locally} | {ms(r.get('p50_ok_ms'))} | {ms(r.get('p99_ok_ms'))} |")
PY
        done
    done
fi

# h2 IN_FLIGHT SECONDS BODY : 64 connections with IN_FLIGHT / 64 streams each (under the
# default --grpc-max-connections and --grpc-max-concurrent-streams).
h2() {
    local deadline=()
    [ -n "$GRPC_TIMEOUT" ] && deadline=(-H "grpc-timeout: $GRPC_TIMEOUT")
    h2load -c 64 -m $(( $1 / 64 )) -t 1 -D "$2" --data "$3" -H 'content-type: application/grpc' \
        -H 'te: trailers' "${deadline[@]}" \
        "http://127.0.0.1:$GRPC_PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
        >"$WORK/h2.out" 2>&1 || true
}

# snap FILE : a snapshot of floodgate's counters (requests by result, store errors by kind,
# leases, store time, the bound), its CPU time and RSS, and Redis's
# commandstats, CPU and keyspace counters, as one JSON line in FILE.
snap() {
    python3 - "$HTTP_PORT" "$REDIS_PORT" "$SRV_PID" >"$1" <<'PY'
import json, os, re, subprocess, sys, urllib.request
http, redis, pid = sys.argv[1:]
m = {}
for line in urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics").read().decode().splitlines():
    if line.startswith("#") or " " not in line:
        continue
    name, value = line.rsplit(" ", 1)
    m[name] = m.get(name, 0) + float(value)
def total(prefix, label=None):
    return sum(v for k, v in m.items() if k.startswith(prefix) and (label is None or label in k))
s = {"results": {r: total("floodgate_requests_total", f'result="{r}"')
                 for r in ("ok", "over_limit", "invalid", "store_error", "overloaded")},
     "errors": {k[k.index('kind="') + 6:-2]: v for k, v in m.items()
                if k.startswith("floodgate_store_errors_total{")},
     "local": total("floodgate_lease_local_answers_total"),
     "acquired": total("floodgate_lease_acquired_total"),
     "lease_tokens": total("floodgate_lease_tokens_total"),
     "store_s": total("floodgate_store_duration_seconds_sum"),
     "store_n": total("floodgate_store_duration_seconds_count"),
     "bound": total("floodgate_redis_calls_bound")}
stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
s["cpu_s"] = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
s["rss_mb"] = int(re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{pid}/status").read()).group(1)) / 1024
info = subprocess.run(["redis-cli", "-p", redis, "info", "all"], capture_output=True, text=True).stdout
def field(name):
    found = re.search(rf"^{name}:([0-9.]+)", info, re.M)
    return float(found.group(1)) if found else 0.0
script = re.search(r"^cmdstat_evalsha:calls=(\d+),usec=(\d+)", info, re.M)
s["calls"], s["usec"] = (int(script.group(1)), int(script.group(2))) if script else (0, 0)
s["redis_cpu_s"] = field("used_cpu_sys") + field("used_cpu_user")
s["commands"] = field("total_commands_processed")
s["expired"] = field("expired_keys")
s["connections"] = field("total_connections_received")
print(json.dumps(s))
PY
}

# closed IN_FLIGHT BODY LABEL : one run of SECONDS_PER_RUN on the running server; prints the
# row (with BASE, the OK/s of the first row, for the ratio; sets BASE when empty).
closed() {
    snap "$WORK/before.json"
    h2 "$1" "$SECONDS_PER_RUN" "$2"
    snap "$WORK/after.json"
    BASE=$(python3 - "$WORK/before.json" "$WORK/after.json" "$SECONDS_PER_RUN" "$3" "${BASE:-}" <<'PY'
import json, sys
before, after, seconds, label, base = sys.argv[1:]
a, b = json.load(open(before)), json.load(open(after))
d = lambda k: b[k] - a[k]
ok = b["results"]["ok"] - a["results"]["ok"]
results = {r: b["results"][r] - a["results"][r] for r in b["results"]}
errors = {k: v - a["errors"].get(k, 0) for k, v in b["errors"].items()}
not_ok = sum(results.values()) - ok
shed = errors.get("shed", 0)
ok_s = ok / float(seconds)
base = float(base) if base else ok_s
why = ", ".join(f"{k} {int(v)}" for k, v in list(results.items())[1:] + [(f"store {k}", v) for k, v in errors.items() if k != "shed"] + [("Redis connections opened", d("connections"))] if v)
per_ok = lambda v: v / ok if ok else float("nan")
calls = d("calls")
print(f"| {label} | {ok_s:.0f} | {int(not_ok)} ({int(shed)}) | {ok_s / max(base, 1):.2f} "
      f"| {per_ok(calls):.3f} | {d('usec') / calls if calls else 0:.1f} | {per_ok(d('local')):.2f} "
      f"| {d('store_s') / d('store_n') * 1e3 if d('store_n') else 0:.2f} "
      f"| {per_ok(d('cpu_s')) * 1e6:.1f} | {per_ok(d('redis_cpu_s')) * 1e6:.1f} "
      f"| {per_ok(sum(results.values()) - shed - d('local')) * 1e3:.1f} | {per_ok(d('acquired')) * 1e3:.1f} | {d('lease_tokens') / d('acquired') if d('acquired') else 0:.0f} "
      f"| {b['rss_mb']:.0f} | {int(b['bound'])} | {why or '-'} |", file=sys.stderr)
print(base)
PY
    )
}

if [[ " $PARTS " == *" closed "* ]]; then
    echo
    echo "## Closed loop: calls in flight, Redis, floodgate, ${SECONDS_PER_RUN} s per run (h2load: 64 connections${GRPC_TIMEOUT:+, grpc-timeout $GRPC_TIMEOUT})"
    echo
    echo "Per row, beside OK/s: script calls per OK answer and Redis's own µs per script call"
    echo "(INFO commandstats), the share of OK answers decided from leases alone, the mean store"
    echo "call (ms, shedder's wait included), floodgate's and Redis's CPU µs per OK answer, the"
    echo "server's RSS and the bound on calls to Redis at the end of the run, and the answers"
    echo "not OK by why (result, then store error kinds other than shed), and the connections Redis"
    echo "accepted during the run."
    echo
    echo "| binary | descriptors | in flight | OK/s | not OK (shed) | OK/s ÷ OK/s at 128 | calls/OK | Redis µs/call | leased | store ms | CPU µs/OK | Redis CPU µs/OK | to Redis per 1k OK | leases per 1k OK | tokens per lease | RSS MB | bound | not OK: why |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for repeat in $(seq "$REPEATS"); do
        for n in $DESCRIPTORS; do
            body=one; [ "$n" = 4 ] && body=four
            for BIN in $BINS; do
                label=$(basename "$(dirname "$BIN")")/$(basename "$BIN")
                start floodgate
                h2 128 2 "$WORK/$body.bin"   # warm-up
                BASE=
                previous=
                for row in $CLOSED_ROWS; do
                    c=${row%%+*} inflight=${row%%+*}
                    if [ "$row" != "$c" ]; then
                        sleep "${row#*+}"
                        inflight="$c (${row#*+} s after $previous)"
                    fi
                    closed "$c" "$WORK/$body.bin" "$label | $n | $inflight" 2>&1 >/dev/null
                    previous=$c
                done
                stop
            done
        done
    done
fi

echo
echo "machine: $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg), Redis $(redis-server --version | awk '{sub("v=", "", $3); print $3}'), $(h2load --version | head -1)"
