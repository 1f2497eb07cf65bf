#!/usr/bin/env python3
"""Reads an h2load --log-file (tab-separated: start µs, status, elapsed µs) and prints
"requests p50_ms p99_ms p999_ms non_2xx"."""
import sys

elapsed, bad = [], 0
with open(sys.argv[1]) as f:
    for line in f:
        parts = line.split()
        if len(parts) < 3:
            continue
        if not parts[1].startswith("2"):
            bad += 1
        elapsed.append(int(parts[2]))
elapsed.sort()


def pct(p):
    if not elapsed:
        return float("nan")
    return elapsed[min(len(elapsed) - 1, int(len(elapsed) * p))] / 1000.0


print(len(elapsed), f"{pct(0.50):.2f}", f"{pct(0.99):.2f}", f"{pct(0.999):.2f}", bad)
