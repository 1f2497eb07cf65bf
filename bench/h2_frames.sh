#!/usr/bin/env bash
# What a rate-limit server's answers cost Envoy on the wire: the HTTP/2 frames and bytes each
# way per answer, by type, on the connection from Envoy's rate-limit filter to the server.
# The same set-up as bench/envoy_path.sh (h2load → Envoy, one worker → a direct-response
# backend; the filter's cluster speaks HTTP/2 to one server on loopback), with
# bench/h2tap.py, a frame-counting relay, between Envoy's rate-limit cluster and the server.
# Rows: the floor (examples/floor.rs), floodgate with the memory store, Limitador with its
# memory store (from ../shared/peers/limitador-server.gz, or LIMITADOR_BIN; skipped when there
# is none).
#
#   bench/h2_frames.sh                        # 5,000 answers per server and run
#   HF_CLIENTS=1 HF_STREAMS=1 bench/h2_frames.sh   # one call at a time
#   HF_REQUESTS=20000 bench/h2_frames.sh
#   HF_ROWS="floor floodgate-memory floodgate-redis limitador-redis" bench/h2_frames.sh
#   BENCH_BIN=/path/floodgate FLOOR_BIN=/path/floor bench/h2_frames.sh
#
# The filter's timeout is HF_RLS_TIMEOUT (1s, not deploy/envoy/envoy.yaml's 75 ms): the relay
# adds a hop, and a call Envoy gives up on is reset (RST_STREAM) instead of answered, which
# is not what an answer costs.
# Each row (a fresh server):
#   - tapped: a front Envoy whose rate-limit cluster is the relay; HF_REQUESTS requests,
#     closed loop, over EP_KEYS (100,000) paths /k/<n> (one descriptor value each). The relay
#     counts every frame of the run, the connection's set-up included (its SETTINGS and first
#     WINDOW_UPDATEs), so a figure per answer is the run's total over the answers (the
#     server's trailers frames) it saw;
#   - direct: a fresh front Envoy asking the server itself, HF_REQUESTS more requests: Envoy's
#     CPU µs per request (user + system, /proc/<pid>/stat, over the requests h2load
#     completed), and the server's write calls (write, writev, sendto, sendmsg) and read calls
#     per answer, all threads, counted by the kernel's syscall tracepoints (perf stat, which
#     does not slow the server; HF_PERF=0 or no perf leaves them out; with Redis they count
#     the server's calls to Redis too).
# The load's shape: HF_CLIENTS (16) connections × HF_STREAMS (4) streams, one thread. At
# 64 in flight Envoy sends the server its calls in batches, and a server answers a batch in
# one write; HF_CLIENTS=1 HF_STREAMS=1 shows one call at a time.
# Columns, per answer: "down" is the server to Envoy, "up" Envoy to the server. Frames
# (HEADERS, DATA, WINDOW_UPDATE, PING, other types together) and bytes (frame headers
# included); the response HEADERS frame's size on the connection's first answer and its most
# common size after it (steady: what HPACK's dynamic table leaves), and the trailers'; the
# relay's reads per answer each way (bounded by the sender's writes). Then each side's
# SETTINGS and the HPACK make-up of the steady answer (bench/h2tap.py's words). OK answers
# over both runs: the server's own count (floodgate_requests_total{result="ok"} for the floor
# and floodgate, Limitador's authorized_calls), Envoy's filter counters
# (cluster.backend.ratelimit.ok / over_limit / error) and h2load's HTTP status classes.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
need_h2load
REQUESTS=${HF_REQUESTS:-5000}
KEYS=${EP_KEYS:-100000}
RLS_TIMEOUT=${HF_RLS_TIMEOUT:-1s}
read -r -a ROWS <<<"${HF_ROWS:-floor floodgate-memory limitador-memory}"
export FLOODGATE_LEASE_FRACTION=${FLOODGATE_LEASE_FRACTION:-0}
envoy_and_servers
CLIENTS=${HF_CLIENTS:-16}
STREAMS=${HF_STREAMS:-4}
# The server's syscalls, counted by the kernel's tracepoints (perf stat: no slow-down).
SYSCALLS=syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendto
SYSCALLS+=,syscalls:sys_enter_sendmsg,syscalls:sys_enter_read,syscalls:sys_enter_readv
SYSCALLS+=,syscalls:sys_enter_recvfrom,syscalls:sys_enter_recvmsg
PERF=${HF_PERF:-1}
perf stat -e "$SYSCALLS" true >/dev/null 2>&1 || PERF=0

find_limitador
write_side_by_side_limits
start_redis
seq 0 $((KEYS - 1)) | sed 's|^|/k/|' >"$WORK/paths.txt"
start_backend
TICKS=$(getconf CLK_TCK)

# front RLS_PORT : a fresh front Envoy whose rate-limit cluster is RLS_PORT; sets FRONT_PID
# and FRONT_PORT.
front() {
    front_config "$1" >"$WORK/front.yaml"
    start_envoy front "$WORK/front.yaml"
    FRONT_PID=$ENVOY_PID
    FRONT_PORT=$(listener_port "$ENVOY_ADMIN" front)
}

# load OUT : HF_REQUESTS requests through the front Envoy, closed loop, HF_CLIENTS
# connections × HF_STREAMS streams in flight.
load() {
    h2load -t 1 -c "$CLIENTS" -m "$STREAMS" -n "$REQUESTS" -B "http://127.0.0.1:$FRONT_PORT" \
        -i "$WORK/paths.txt" >"$1" 2>&1
}

# answered OUT : the requests h2load completed in its output OUT.
answered() { sed -n 's/^requests: [0-9]* total, [0-9]* started, \([0-9]*\) done.*/\1/p' "$1"; }

stop_front() { kill "$FRONT_PID"; wait "$FRONT_PID" 2>/dev/null || true; }

# row ROW : one server's runs; writes $WORK/ROW.json (the relay's report) and prints
# "envoy_ticks done ok_server envoy_ok envoy_over envoy_error writes reads 2xx non2xx".
row() {
    local row=$1
    start_rls "$row"
    # The relay, on a free port (it writes the port once it listens).
    rm -f "$WORK/tap.port"
    python3 bench/h2tap.py "127.0.0.1:$GRPC_PORT" "$WORK/tap.port" "$WORK/$row.json" \
        >"$WORK/$row.tap" 2>&1 &
    local tap=$!
    PIDS+=("$tap")
    until [ -s "$WORK/tap.port" ]; do
        kill -0 "$tap" 2>/dev/null || { cat "$WORK/$row.tap" >&2; exit 1; }
        sleep 0.05
    done
    front "$(cat "$WORK/tap.port")"
    load "$WORK/tapped.out"
    local s0 s1
    s0=$(ratelimit_stats)
    stop_front
    kill -TERM "$tap"; wait "$tap" 2>/dev/null || true

    front "$GRPC_PORT"
    local e0 e1 perf=""
    if [ "$PERF" = 1 ]; then
        perf stat -x, -o "$WORK/perf.out" -e "$SYSCALLS" -p "$SRV_PID" &
        perf=$!
    fi
    e0=$(cpu_ticks "$FRONT_PID")
    load "$WORK/direct.out"
    e1=$(cpu_ticks "$FRONT_PID")
    local writes=- reads=-
    if [ -n "$perf" ]; then
        kill -INT "$perf"; wait "$perf" 2>/dev/null || true
        read -r writes reads < <(awk -F, -v n="$(answered "$WORK/direct.out")" '
            $3 ~ /sys_enter_(write|writev|sendto|sendmsg)$/ { w += $1 }
            $3 ~ /sys_enter_(read|readv|recvfrom|recvmsg)$/ { r += $1 }
            END { printf "%.2f %.2f\n", w / n, r / n }' "$WORK/perf.out")
    fi
    s1=$(ratelimit_stats)
    local ok
    if [ "${row%-*}" = limitador ]; then
        ok=$(curl -s "127.0.0.1:$RLS_HTTP/metrics" |
            awk '$1 ~ /^authorized_calls/ { ok += $2 } END { print ok + 0 }')
    else
        ok=$(ok_answers "$RLS_HTTP")
    fi
    stop_front
    kill "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true
    local done2xx
    done2xx=$(cat "$WORK/tapped.out" "$WORK/direct.out" | awk '
        /requests: .* done/ { for (i = 1; i <= NF; i++) if ($(i + 1) ~ /^done/) d += $i }
        /^status codes:/ { ok += $3; bad += $5 + $7 + $9 }
        END { print d + 0, ok + 0, bad + 0 }')
    local direct
    direct=$(answered "$WORK/direct.out")
    # Envoy's counters: the tapped run's (s0, from a fresh Envoy) and the direct runs' (s1).
    echo "$((e1 - e0)) $direct $ok $s0 $s1 $writes $reads $done2xx"
}

RESULTS=$WORK/results
: >"$RESULTS"
for r in "${ROWS[@]}"; do
    if [ "${r%-*}" = limitador ] && [ -z "$LIMITADOR" ]; then continue; fi
    echo "$r $(row "$r")" >>"$RESULTS"
done

python3 - "$RESULTS" "$WORK" "$TICKS" <<'PY'
import json, sys
results, work, ticks = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = []
for line in open(results):
    (row, envoy, direct, ok, t_ok, t_over, t_err, d_ok, d_over, d_err, writes, reads, done,
     c2, cbad) = line.split()
    rows.append((row, json.load(open(f"{work}/{row}.json")), int(envoy), int(direct), ok,
                 [int(t_ok) + int(d_ok), int(t_over) + int(d_over), int(t_err) + int(d_err)],
                 writes, reads, c2, cbad))

def per(d, key, name, n):
    return d[key].get(name, 0) / n

print("| server | answers seen | frames down: HEADERS / DATA / WINDOW_UPDATE / PING / other "
      "| bytes down: all (HEADERS, DATA) | frames up: HEADERS / DATA / WINDOW_UPDATE / PING / "
      "other | bytes up: all (HEADERS, DATA) | response HEADERS bytes first / steady | "
      "trailers bytes first / steady | relay reads down / up | server writes / reads "
      "| Envoy CPU µs/req | OK (server) | Envoy ok / over_limit / error | HTTP 2xx / "
      "other |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
main = ("HEADERS", "DATA", "WINDOW_UPDATE", "PING")
for row, r, envoy, direct, ok, stats, writes, reads, c2, cbad in rows:
    n = max(r["answers"], 1)
    cells = []
    for way in ("down", "up"):
        d = r[way]
        other = sum(v for k, v in d["frames"].items() if k not in main) / n
        cells.append(" / ".join(f"{per(d, 'frames', k, n):.3f}" for k in main) +
                     f" / {other:.3f}")
        cells.append(f"{d['raw_bytes'] / n:.1f} ({per(d, 'bytes', 'HEADERS', n):.1f}, "
                     f"{per(d, 'bytes', 'DATA', n):.1f})")
    down = r["down"]
    def sizes(kind):
        s = down[kind]
        return f"{'+'.join(map(str, s['first'])) or '-'} / {s['steady']}"
    envoy_us = 1e6 * envoy / ticks / max(direct, 1)
    print(f"| {row.replace('-', ', ')} | {r['answers']} | {cells[0]} | {cells[1]} | {cells[2]} "
          f"| {cells[3]} | {sizes('headers')} | {sizes('trailers')} | "
          f"{down['chunks'] / n:.3f} / {r['up']['chunks'] / n:.3f} | {writes} / {reads} | "
          f"{envoy_us:.1f} | {ok} | {'/'.join(map(str, stats))} | {c2} / {cbad} |")
print()
for row, r, *_ in rows:
    print(f"{row}: {r['connections']} connection(s)")
    for way, who in (("up", "Envoy"), ("down", "server")):
        d = r[way]
        print(f"  {who} SETTINGS: {d['settings']}; WINDOW_UPDATE frames {d['window_updates']}, "
              f"increments {d['window_increments']}; PING {d['pings']}")
    for kind, shape, count in r["up"]["hpack_common"][:1]:
        print(f"  Envoy {kind} HPACK ({count}×): {shape}")
    for kind, shape, count in r["down"]["hpack_common"][:2]:
        print(f"  server {kind} HPACK ({count}×): {shape}")
    for kind, shape in r["down"]["hpack_first"]:
        print(f"  server first {kind} HPACK: {shape}")
PY
echo
echo "machine: $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average: $(cut -d' ' -f1-3 /proc/loadavg), Envoy $("$ENVOY" --version 2>/dev/null | awk '/version:/{print $NF}'), $(h2load --version | head -1), $REQUESTS requests per run, FLOODGATE_LEASE_FRACTION=$FLOODGATE_LEASE_FRACTION"
