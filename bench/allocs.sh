#!/usr/bin/env bash
# Heap allocations and bytes allocated per request of one or more floodgate binaries, on the
# bench's load: the allocator's share of the Redis path's CPU comes from how many blocks each
# request allocates, and that count is exact on any machine, loaded or not.
#
#   bench/allocs.sh BIN [BIN…]                      # Redis, 1 and 4 descriptors
#   ALLOC_ROWS="none memory one four" ALLOC_REQUESTS=20000 bench/allocs.sh A B
#
# Counts calls of mimalloc's allocation entry points (`mi_malloc_aligned`,
# `mi_zalloc_aligned`: what Rust's global allocator calls; `mi_realloc_aligned` apart) with
# perf uprobes, attached to the server during the timed requests only (after a warm-up), and
# divides by the requests; the same probes, recorded with their size argument, give the bytes
# those allocations asked for (reallocations not included). Needs root (uprobes) and a
# binary with its symbols (not stripped). Rows as bench/cpu_ab.sh: none (an unknown domain),
# memory (the in-process store, 1 descriptor), one and four (Redis, 1 and 4 descriptors).
# Uprobes slow the server down: count with it, never time.
# Leases are off unless FLOODGATE_LEASE_FRACTION says otherwise (the leased row:
# FLOODGATE_LEASE_FRACTION=0.1 ALLOC_ROWS=one ALLOC_WARMUP=10000, so the lease is hot).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
[ $# -ge 1 ] || { sed -n '2,18p' "$0"; exit 2; }
BINS=("$@")
REQUESTS=${ALLOC_REQUESTS:-20000}
WARMUP=${ALLOC_WARMUP:-5000}
read -r -a ROWS <<<"${ALLOC_ROWS:-one four}"

ab_setup

# count BIN ROW : prints "allocations reallocations bytes" per request for one fresh server.
count() {
    local bin=$1 row=$2 pid group
    group="fgallocs$$"
    # The size argument is the first (x86-64: %di) of both allocation entry points.
    perf probe -q -x "$bin" -a "$group:malloc=mi_malloc_aligned size=%di:u64" \
        -a "$group:zalloc=mi_zalloc_aligned size=%di:u64" -a "$group:realloc=mi_realloc_aligned"
    ab_start "$bin" "$row" "$WORK/server.log" --redis-timeout-ms 1000
    pid=$AB_PID
    ab_h2 16 8 -n "$WARMUP" >/dev/null 2>&1
    perf stat -x, -e "$group:malloc,$group:zalloc,$group:realloc" -p "$pid" \
        -o "$WORK/perf.out" &
    local perf=$!
    # The sizes: each allocation recorded with its argument (a large buffer, so none is lost).
    perf record -q -m 4096 -e "$group:malloc,$group:zalloc" -p "$pid" \
        -o "$WORK/sizes.data" >/dev/null 2>&1 &
    local record=$!
    sleep 0.5
    ab_h2 16 8 -n "$REQUESTS" >"$WORK/h2.out" 2>&1
    kill -INT "$perf" "$record"; wait "$perf" "$record" 2>/dev/null || true
    kill "$pid"; wait "$pid" 2>/dev/null || true
    perf script -i "$WORK/sizes.data" -F trace 2>/dev/null >"$WORK/sizes.txt" || true
    rm -f "$WORK/sizes.data"
    perf probe -q -d "$group:*"
    python3 - "$WORK/perf.out" "$REQUESTS" "$WORK/sizes.txt" <<'PY'
import re, sys
counts = {}
for line in open(sys.argv[1]):
    fields = line.strip().split(",")
    if len(fields) > 2 and fields[0].isdigit():
        counts[fields[2].split(":")[-1]] = int(fields[0])
n = int(sys.argv[2])
allocs = counts.get('malloc', 0) + counts.get('zalloc', 0)
sizes = [int(m.group(1), 0) for m in map(re.compile(r"size=(\S+)").search, open(sys.argv[3]))
         if m]
# Bytes only when the record saw (nearly) every allocation perf stat counted: none lost.
recorded = allocs == 0 or len(sizes) >= 0.99 * allocs
print(f"{allocs / n:.1f} {counts.get('realloc', 0) / n:.1f} "
      + (f"{sum(sizes) / n:.0f}" if recorded else f"?({len(sizes)}/{allocs}_recorded)"))
PY
}

echo "| row | binary | allocations per request | reallocations per request | bytes allocated per request |"
echo "|---|---|---|---|---|"
for row in "${ROWS[@]}"; do
    for i in "${!BINS[@]}"; do
        read -r allocs reallocs bytes < <(count "${BINS[$i]}" "$row")
        echo "| $row | $i: ${BINS[$i]} | $allocs | $reallocs | $bytes |"
    done
done
