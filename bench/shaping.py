#!/usr/bin/env python3
"""Reads two h2load --log-file files (tab-separated: start µs since epoch, HTTP status, µs
until the end of the response) of the same burst against an unshaped and a shaped limit
(bench/shaping.sh), prints a markdown table and plots the admitted requests over time.

Usage: shaping.py UNSHAPED.log SHAPED.log OUT.png STORE
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RATE = 100.0  # requests per second (bench/shaping.sh's limit)
BURST = 20
INTERVAL_MS = 1000.0 / RATE


def answers(path):
    """[(answered ms after the burst's first request was sent, status)], by answer time."""
    rows = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3:
                rows.append((int(parts[0]), int(parts[1]), int(parts[2])))
    t0 = min(start for start, _, _ in rows)
    return sorted(((start + took - t0) / 1000.0, status) for start, status, took in rows)


def summary(name, rows):
    ok = [t for t, status in rows if status == 200]
    refused = [t for t, status in rows if status == 429]
    other = len(rows) - len(ok) - len(refused)
    # The k-th admitted request past the burst may pass k intervals after the first answer
    # (an upper bound on when the store saw the burst); lateness is how much later it came.
    late = [t - (ok[0] + k * INTERVAL_MS) for k, t in enumerate(ok[BURST:], start=1)] if ok else []
    late.sort()
    span = ok[-1] - ok[BURST - 1] if len(ok) > BURST else 0.0
    rate = f"{(len(ok) - BURST) / span * 1000.0:.0f}" if span > 0 else "-"
    p50 = f"{late[len(late) // 2]:.1f}" if late else "-"
    worst = f"{late[-1]:.1f}" if late else "-"
    print(
        f"| {name} | {len(rows)} | {len(ok)} | {len(refused)} | {other} | "
        f"{ok[-1] if ok else 0:.0f} | {rate} | {p50} | {worst} |"
    )
    return ok, refused


def main():
    unshaped_path, shaped_path, out, store = sys.argv[1:5]
    print(
        "| limit (100/s, burst 20) | requests | OK | refused | errors | last OK at ms | "
        "admitted/s after the burst | lateness p50 ms | lateness max ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    unshaped_ok, unshaped_refused = summary("unshaped", answers(unshaped_path))
    shaped_ok, _ = summary("shaped (max_wait: 2s)", answers(shaped_path))

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.step(shaped_ok, range(1, len(shaped_ok) + 1), where="post", label="shaped: admitted (OK)")
    ax.step(
        unshaped_ok, range(1, len(unshaped_ok) + 1), where="post", label="unshaped: admitted (OK)"
    )
    ax.step(
        unshaped_refused,
        range(1, len(unshaped_refused) + 1),
        where="post",
        linestyle="--",
        label="unshaped: refused (429)",
    )
    horizon = max(shaped_ok[-1] if shaped_ok else 0, 100)
    ax.plot(
        [0, horizon],
        [BURST, BURST + horizon / INTERVAL_MS],
        linestyle=":",
        color="grey",
        label="burst + 100/s",
    )
    ax.set_xlabel("ms after the burst was sent")
    ax.set_ylabel("requests answered")
    ax.set_title(f"200 requests at once against 100/s, burst 20 ({store} store)")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    print(f"plot: {out}")


main()
