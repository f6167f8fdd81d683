#!/usr/bin/env python3
"""Per-kernel GPU time from an Nsight Compute CSV (ncu --metrics gpu__time_duration.sum --csv).

Usage: kernel_times.py profile.csv [--top N]

Prints a Markdown table: kernel name (shortened), launches, total and mean time, share of the total,
largest first. With `scripts/gpu_session.sh profile-ops` the CSV covers one `linearize_gpu_bench ops
--quick` run (softmax attention and the ops chosen with OPS_ARGS, each run 1 + 3 times).
"""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"\(.*", "", name)  # drop the argument list
    return name.replace("void ", "").strip()[:110]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 30
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own log lines before the CSV
    total = defaultdict(float)
    count = defaultdict(int)
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        ns = float(row["Metric Value"].replace(",", ""))
        if row.get("Metric Unit", "ns") in ("usecond", "us"):
            ns *= 1e3
        elif row.get("Metric Unit") in ("msecond", "ms"):
            ns *= 1e6
        k = short(row["Kernel Name"])
        total[k] += ns
        count[k] += 1
    if not total:
        sys.exit("no gpu__time_duration.sum rows in " + sys.argv[1])
    all_ns = sum(total.values())
    print("| kernel | launches | total ms | mean us | share |")
    print("|---|---|---|---|---|")
    for k in sorted(total, key=total.get, reverse=True)[:top]:
        print(f"| {k} | {count[k]} | {total[k] / 1e6:.2f} | {total[k] / count[k] / 1e3:.1f} | {100 * total[k] / all_ns:.1f}% |")
    print(f"\nall kernels: {all_ns / 1e6:.2f} ms in {sum(count.values())} launches")


if __name__ == "__main__":
    main()
