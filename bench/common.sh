# shellcheck shell=bash
# Sourced by the bench scripts: h2load (installed when missing), a scratch directory $WORK
# whose processes (pushed on PIDS) are stopped and which is removed when the script exits,
# and free_port for loopback listeners.

need_h2load() {
    command -v h2load >/dev/null || {
        echo "installing nghttp2-client (h2load)"
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo=sudo
        $sudo apt-get update -qq && $sudo apt-get install -y -qq nghttp2-client >/dev/null
    }
}

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The side-by-side limits, 10^6 per second per value so that nothing is ever over limit:
# floodgate's domains `one` (descriptor k0) and `four` (k0..k3) in $WORK/limits/, Limitador's
# namespaces of the same names in $WORK/limitador.yaml (one limit per descriptor i, variable
# descriptors[i]['k<i>']: separate namespaces, because a Limitador limit whose variable a
# request lacks fails it), and the gRPC bodies $WORK/one.bin and $WORK/four.bin.
write_side_by_side_limits() {
    mkdir -p "$WORK/limits"
    local domain n i
    for domain in one four; do
        n=1; [ "$domain" = four ] && n=4
        {
            echo "domain: $domain"
            echo "descriptors:"
            for i in $(seq 0 $((n - 1))); do
                echo "  - {key: k$i, rate_limit: {unit: second, requests_per_unit: 1000000}}"
            done
        } > "$WORK/limits/$domain.yaml"
        for i in $(seq 0 $((n - 1))); do
            cat <<YAML
- namespace: $domain
  max_value: 1000000
  seconds: 1
  conditions: []
  variables: ["descriptors[$i]['k$i']"]
YAML
        done
        python3 bench/grpc_body.py "$domain" "$n" "$WORK/$domain.bin"
    done > "$WORK/limitador.yaml"
}

# A redis-server on a free loopback port, no persistence, stopped on exit; sets REDIS_PORT
# and REDIS_PID.
start_redis() {
    REDIS_PORT=$(free_port)
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
        --logfile "$WORK/redis.log" --daemonize no &
    REDIS_PID=$!
    PIDS+=($!)
    until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.1; done
}

# Limitador for the side-by-side rows: LIMITADOR_BIN, else unpacked from
# ../shared/peers/limitador-server.gz into $WORK; sets LIMITADOR (empty when there is none).
find_limitador() {
    LIMITADOR=${LIMITADOR_BIN:-}
    if [ -z "$LIMITADOR" ] && [ -f ../shared/peers/limitador-server.gz ]; then
        LIMITADOR=$WORK/limitador-server
        gunzip -c ../shared/peers/limitador-server.gz > "$LIMITADOR"
        chmod +x "$LIMITADOR"
    fi
    [ -n "$LIMITADOR" ] || echo "(no Limitador binary: floodgate rows only)"
}

# ab_summary RESULTS LABEL DECIMALS BIN... : the summary of an A/B run (bench/cpu_ab.sh,
# bench/ir_ab.sh). RESULTS holds one line per run, "row binary-index value not-ok"; prints per
# row and binary the median value (against the first binary's), every run's value, and the
# answers not OK over all runs.
ab_summary() {
    local results=$1 label=$2 decimals=$3
    shift 3
    echo "| row | binary | median $label | runs | not OK (all runs) |"
    echo "|---|---|---|---|---|"
    python3 - "$results" "$decimals" "$@" <<'PY'
import statistics, sys
path, decimals, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
for line in open(path):
    row, i, value, bad = line.split()
    rows.setdefault((row, int(i)), []).append((float(value), int(bad)))
base = {}
for (row, i), runs in rows.items():
    values = [v for v, _ in runs]
    median = statistics.median(values)
    base.setdefault(row, median)
    change = f" ({100 * (median / base[row] - 1):+.1f} %)" if base[row] else ""
    print(f"| {row} | {i}: {bins[i]} | {median:.{decimals}f}{change} | "
          f"{', '.join(f'{v:.{decimals}f}' for v in values)} | {sum(b for _, b in runs)} |")
PY
}

# --- The A/B scripts' rows (bench/cpu_ab.sh, bench/ir_ab.sh, bench/allocs.sh) -------------
# Rows: none (no store: an unknown domain), memory (the in-process store, 1 descriptor), one
# and four (Redis, 1 and 4 descriptors, 10^6 per second each, as bench/side_by_side.sh's);
# the load: h2load repeating the row's body, one thread.

# ab_setup : h2load, the side-by-side limits and bodies, the no-store body $WORK/none.bin, a
# redis-server (REDIS_PORT), and leases off unless FLOODGATE_LEASE_FRACTION says otherwise:
# the load is one hot bucket per descriptor, which leases would answer mostly without Redis,
# and these rows measure the per-request Redis path.
ab_setup() {
    need_h2load
    export FLOODGATE_LEASE_FRACTION=${FLOODGATE_LEASE_FRACTION:-0}
    write_side_by_side_limits
    python3 bench/grpc_body.py nobody 1 "$WORK/none.bin"
    start_redis
}

# ab_start BIN ROW LOG [ARGS…] : starts `BIN serve` for ROW on free ports (under the command
# in the array AB_PREFIX, e.g. valgrind, when set), with ROW's store and ARGS, on a flushed
# Redis, and waits (at most 120 s) for its healthcheck; sets AB_PID, AB_HTTP (its admin
# port), AB_URL (ShouldRateLimit) and AB_BODY (ROW's request body). A BIN named `floor` is
# the floor (examples/floor.rs), started with its own flags (ARGS not passed).
ab_start() {
    local bin=$1 row=$2 log=$3 grpc
    shift 3
    grpc=$(free_port); AB_HTTP=$(free_port)
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    local store_args=(--redis-url "redis://127.0.0.1:$REDIS_PORT/") body=$row
    [ "$row" = memory ] && store_args=() && body=one
    AB_BODY=$WORK/$body.bin
    AB_URL="http://127.0.0.1:$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    if [ "$(basename "$bin")" = floor ]; then
        # The floor (examples/floor.rs) takes no configuration, store or server flags: it
        # states the row's limit in each status, none on the no-store row.
        local statuses=limited
        [ "$row" = none ] && statuses=bare
        "${AB_PREFIX[@]}" "$bin" --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$AB_HTTP" \
            --statuses "$statuses" >"$log" 2>&1 &
    else
        RUST_LOG=warn "${AB_PREFIX[@]}" "$bin" serve --config "$WORK/limits" \
            --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$AB_HTTP" \
            "${store_args[@]}" "$@" >"$log" 2>&1 &
    fi
    AB_PID=$!
    local deadline=$((SECONDS + 120))
    until curl -sf "127.0.0.1:$AB_HTTP/healthcheck" >/dev/null; do
        if [ $SECONDS -ge $deadline ] || ! kill -0 "$AB_PID" 2>/dev/null; then
            echo "server did not come up; its log:" >&2
            cat "$log" >&2
            exit 1
        fi
        sleep 0.1
    done
}
AB_PREFIX=()

# ab_h2 CLIENTS STREAMS ARGS… : h2load with the row's body to the server ab_start started,
# CLIENTS connections × STREAMS requests in flight on each, one thread.
ab_h2() {
    local clients=$1 streams=$2
    shift 2
    h2load -c "$clients" -m "$streams" -t 1 -H 'content-type: application/grpc' \
        -H 'te: trailers' --data "$AB_BODY" "$@" "$AB_URL"
}

# ok_answers PORT : the OK answers the server at HTTP port PORT has counted.
ok_answers() {
    curl -s "127.0.0.1:$1/metrics" | awk '
        $1 ~ /^floodgate_requests_total/ && $1 ~ /result="ok"/ { ok += $2 }
        END { print ok + 0 }'
}

# not_ok_answers PORT : the answers that were not OK the server at HTTP port PORT has counted.
not_ok_answers() {
    curl -s "127.0.0.1:$1/metrics" | awk '
        $1 ~ /^floodgate_requests_total/ { all += $2; if ($1 ~ /result="ok"/) ok += $2 }
        END { print all - ok }'
}

# h2_failed FILE… : the requests h2load failed or errored, summed over its outputs FILE….
h2_failed() {
    cat "$@" | sed -n 's/.* succeeded, \([0-9]*\) failed, \([0-9]*\) errored.*/\1 \2/p' |
        awk '{ bad += $1 + $2 } END { print bad + 0 }'
}

# --- The data path through Envoy (bench/envoy_path.sh, bench/h2_frames.sh) ---------------
# ENVOY is the Envoy binary; the configs and logs go to $WORK.

# envoy_and_servers: the Envoy binary (ENVOY_BIN, or the pinned one, installed when missing)
# and the production floodgate and floor (BENCH_BIN and FLOOR_BIN, or built): sets ENVOY,
# BIN and FLOOR.
envoy_and_servers() {
    local target=${CARGO_TARGET_DIR:-target} build=()
    ENVOY=${ENVOY_BIN:-.tools/bin/envoy}
    [ -x "$ENVOY" ] || scripts/install-test-tools.sh envoy >/dev/null
    [ -n "${BENCH_BIN:-}" ] || build+=(--bin floodgate)
    [ -n "${FLOOR_BIN:-}" ] || build+=(--example floor)
    [ ${#build[@]} -eq 0 ] || cargo build --profile production --quiet "${build[@]}"
    BIN=${BENCH_BIN:-$target/production/floodgate}
    FLOOR=${FLOOR_BIN:-$target/production/examples/floor}
}

# start_envoy NAME CONFIG : starts an Envoy on CONFIG (one worker, no hot restart), on CPU
# ENVOY_CPU only when that is set; sets ENVOY_PID and ENVOY_ADMIN (host:port) once it is ready.
start_envoy() {
    local name=$1 config=$2 pin=()
    [ -z "${ENVOY_CPU:-}" ] || pin=(taskset -c "$ENVOY_CPU")
    rm -f "$WORK/$name.admin"
    "${pin[@]}" "$ENVOY" --concurrency 1 --disable-hot-restart -l warning -c "$config" \
        --admin-address-path "$WORK/$name.admin" >"$WORK/$name.log" 2>&1 &
    ENVOY_PID=$!
    PIDS+=("$ENVOY_PID")
    local deadline=$((SECONDS + 60))
    until [ -s "$WORK/$name.admin" ] &&
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$(cat "$WORK/$name.admin")/ready")" = 200 ]; do
        if [ $SECONDS -ge $deadline ] || ! kill -0 "$ENVOY_PID" 2>/dev/null; then
            echo "Envoy $name did not come up; its log:" >&2
            cat "$WORK/$name.log" >&2
            exit 1
        fi
        sleep 0.1
    done
    ENVOY_ADMIN=$(cat "$WORK/$name.admin")
}

# listener_port ADMIN NAME : the port the listener NAME is bound to.
listener_port() {
    curl -s "$1/listeners?format=json" | python3 -c '
import json, sys
for status in json.load(sys.stdin)["listener_statuses"]:
    if status["name"] == sys.argv[1]:
        print(status["local_address"]["socket_address"]["port_value"])' "$2"
}

# hcm PREFIX ROUTE FILTERS : an HTTP connection manager (YAML, indented for a filter chain).
hcm() {
    cat <<YAML
          - name: envoy.filters.network.http_connection_manager
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
              stat_prefix: $1
              route_config:
                virtual_hosts:
                  - name: $1
                    domains: ["*"]
                    routes:
                      - match: {prefix: "/"}
$2
              http_filters:
$3
                - name: envoy.filters.http.router
                  typed_config:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
YAML
}

# start_backend : the backend Envoy, a direct response 200 to every request; sets
# BACKEND_PORT.
start_backend() {
    cat >"$WORK/backend.yaml" <<YAML
static_resources:
  listeners:
    - name: backend
      address: {socket_address: {address: 127.0.0.1, port_value: 0}}
      filter_chains:
        - filters:
$(hcm backend '                        direct_response: {status: 200, body: {inline_string: ok}}' '')
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}
YAML
    start_envoy backend "$WORK/backend.yaml"
    BACKEND_PORT=$(listener_port "$ENVOY_ADMIN" backend)
}

# front_config RLS_PORT : the front Envoy's bootstrap, forwarding to the backend at
# BACKEND_PORT, with the rate-limit filter (timeout RLS_TIMEOUT) asking the server at
# RLS_PORT, or no filter when RLS_PORT is empty.
front_config() {
    local rls=$1 filter=""
    if [ -n "$rls" ]; then
        filter=$(cat <<YAML
                - name: envoy.filters.http.ratelimit
                  typed_config:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                    domain: one
                    timeout: $RLS_TIMEOUT
                    failure_mode_deny: false
                    enable_x_ratelimit_headers: DRAFT_VERSION_03
                    rate_limit_service:
                      transport_api_version: V3
                      grpc_service: {envoy_grpc: {cluster_name: ratelimit}}
YAML
)
    fi
    cat <<YAML
static_resources:
  listeners:
    - name: front
      address: {socket_address: {address: 127.0.0.1, port_value: 0}}
      filter_chains:
        - filters:
$(hcm front '                        route:
                          cluster: backend
                          rate_limits:
                            - actions:
                                - request_headers: {header_name: ":path", descriptor_key: k0}' "$filter")
  clusters:
    - name: backend
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: backend
        endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $BACKEND_PORT}}}}]}]
    - name: ratelimit
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {http2_protocol_options: {}}
      load_assignment:
        cluster_name: ratelimit
        endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: ${rls:-1}}}}}]}]
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}
YAML
}

# start_rls ROW : starts the row's rate-limit server (none for nobody): ROW is floor,
# floodgate-memory, floodgate-redis, limitador-memory or limitador-redis, from FLOOR, BIN and
# LIMITADOR, with $WORK's limits and the Redis at REDIS_PORT (flushed); sets GRPC_PORT,
# RLS_HTTP (its HTTP port) and SRV_PID (all empty for nobody).
start_rls() {
    local server=${1%-*} store=${1#*-}
    GRPC_PORT="" SRV_PID="" RLS_HTTP=""
    [ "$1" != nobody ] || return 0
    GRPC_PORT=$(free_port)
    RLS_HTTP=$(free_port)
    local http=$RLS_HTTP
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    case $server in
        floor)
            "$FLOOR" --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$http" \
                >"$WORK/server.log" 2>&1 &
            ;;
        floodgate)
            local args=()
            [ "$store" = redis ] && args=(--redis-url "redis://127.0.0.1:$REDIS_PORT/")
            RUST_LOG=warn "$BIN" serve --config "$WORK/limits" --grpc-addr "127.0.0.1:$GRPC_PORT" \
                --http-addr "127.0.0.1:$http" "${args[@]}" >"$WORK/server.log" 2>&1 &
            ;;
        limitador)
            local args=(memory)
            [ "$store" = redis ] && args=(redis "redis://127.0.0.1:$REDIS_PORT")
            "$LIMITADOR" -b 127.0.0.1 -p "$GRPC_PORT" -B 127.0.0.1 -P "$http" \
                "$WORK/limitador.yaml" "${args[@]}" >"$WORK/server.log" 2>&1 &
            ;;
    esac
    SRV_PID=$!
    PIDS+=("$SRV_PID")
    until python3 -c "import socket; socket.create_connection(('127.0.0.1', $GRPC_PORT), 0.2)" 2>/dev/null; do
        kill -0 "$SRV_PID" 2>/dev/null || { cat "$WORK/server.log" >&2; exit 1; }
        sleep 0.1
    done
}

# cpu_ticks PID : the user + system clock ticks PID has used (0 when PID is empty).
cpu_ticks() { [ -n "$1" ] && awk '{print $14 + $15}' "/proc/$1/stat" || echo 0; }

# ratelimit_stats : the front Envoy's filter counters so far: "ok over_limit error".
ratelimit_stats() {
    curl -s "$ENVOY_ADMIN/stats?filter=cluster.backend.ratelimit" | awk -F': ' '
        { v[$1] = $2 }
        END { print v["cluster.backend.ratelimit.ok"] + 0, v["cluster.backend.ratelimit.over_limit"] + 0,
                    v["cluster.backend.ratelimit.error"] + 0 }'
}
