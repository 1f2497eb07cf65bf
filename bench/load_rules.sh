#!/usr/bin/env bash
# Memory and time of loading many rules from files: the release binary (memory store) loads
# N rules (default 20000, 50000, 100000: files of 5,000 `key=v<i>` descriptors each), and
# prints its peak RSS (VmHWM) and the time to "limits loaded"; then every file is rewritten
# (a reload while the first limits are in force) and the peak is read again. The figures
# decide `--max-load-rules` (docs/config.md, "Sizing --max-load-rules").
#
#   bench/load_rules.sh                 # 20000 50000 100000
#   bench/load_rules.sh 30000 40000     # other sizes
#   FLOODGATE_BIN=path/to/floodgate bench/load_rules.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh

if [ -z "${FLOODGATE_BIN:-}" ]; then
    cargo build --release --quiet --bin floodgate
fi
BIN=${FLOODGATE_BIN:-${CARGO_TARGET_DIR:-target}/release/floodgate}
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(20000 50000 100000)
PER_FILE=5000

generate() { # N DIR [first requests_per_unit digit]
    python3 - "$1" "$2" "${3:-}" <<'PY'
import os, sys
n, d, prefix = int(sys.argv[1]), sys.argv[2], sys.argv[3]
per = 5000
os.makedirs(d, exist_ok=True)
for f in range((n + per - 1) // per):
    with open(f"{d}/d{f}.tmp", "w") as o:
        o.write(f"domain: dom{f}\ndescriptors:\n")
        for i in range(f * per, min(n, (f + 1) * per)):
            o.write(f"  - key: k\n    value: v{i}\n    rate_limit:\n"
                    f"      unit: second\n      requests_per_unit: {prefix}{i % 1000 + 1}\n")
    os.replace(f"{d}/d{f}.tmp", f"{d}/d{f}.yaml")
PY
}

peak_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status"; }

# Waits (at most 120 s) until the log holds $2 lines "limits loaded" or "limits reloaded".
wait_loads() {
    local deadline=$((SECONDS + 120))
    until [ "$(grep -cE 'limits (re)?loaded' "$1" || true)" -ge "$2" ]; do
        [ $SECONDS -lt $deadline ] || { echo "no load $2 within 120 s:"; tail -5 "$1"; exit 1; }
        sleep 0.05
    done
}

printf '%-8s %-14s %-16s %-18s\n' rules load_s peak_MiB peak_after_reload_MiB
for n in "${SIZES[@]}"; do
    dir="$WORK/r$n"
    generate "$n" "$dir"
    log="$WORK/r$n.log"
    start=$(date +%s.%N)
    "$BIN" serve --config "$dir" --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 \
        --watch-config true --max-load-rules "$n" >"$log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_loads "$log" 1
    took=$(echo "$(date +%s.%N) - $start" | bc)
    first=$(peak_kib "$pid")
    loads=$(grep -cE 'limits (re)?loaded' "$log")
    generate "$n" "$dir" 1
    wait_loads "$log" $((loads + 1))
    # The watcher may see the rewrite as more than one change: let it settle.
    sleep 2
    printf '%-8s %-14.2f %-16s %-18s\n' "$n" "$took" $((first / 1024)) $(($(peak_kib "$pid") / 1024))
    kill "$pid"
    wait "$pid" 2>/dev/null || true
done
