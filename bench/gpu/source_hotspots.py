#!/usr/bin/env python3
"""The source lines where a kernel's warps stall most, from an Nsight Compute report collected with
the SourceCounters section (ncu --section SourceCounters --import-source yes -o report ...).

Usage: source_hotspots.py report.ncu-rep [--top N]

Reads the report through ncu's Python interface (ncu_report, found next to the ncu on the PATH). For
each profiled kernel launch it sums the warp-state samples (smsp__pcsamp_*) of every instruction on
its CUDA source line (the build needs -lineinfo) and prints the N lines (default 25) with the most
samples: their share of the kernel's samples, the two largest stall reasons and the source text.
With `scripts/gpu_session.sh profile-source` the report covers the kernels chosen by SOURCE_KERNELS
in one `linearize_gpu_bench ops --quick` run.
"""
import glob
import os
import shutil
import sys
from collections import defaultdict


def import_ncu_report():
    ncu = shutil.which("ncu")
    roots = [os.path.dirname(os.path.realpath(ncu))] if ncu else []
    roots += glob.glob("/opt/nvidia/nsight-compute/*") + glob.glob("/usr/local/cuda*/nsight-compute*")
    for root in roots:
        for sub in ("extras/python", "../extras/python"):
            path = os.path.normpath(os.path.join(root, sub))
            if os.path.isfile(os.path.join(path, "ncu_report.py")):
                sys.path.insert(0, path)
                import ncu_report

                return ncu_report
    sys.exit("source_hotspots.py: ncu_report.py (Nsight Compute's extras/python) not found")


STALLED = "smsp__pcsamp_warps_issue_stalled_"


def per_pc(action, name):
    """{pc: value} of an instanced per-instruction metric, or {} when the launch has none."""
    metric = action.metric_by_name(name)
    if metric is None or metric.num_instances() == 0:
        return {}
    pcs = metric.correlation_ids()
    return {pcs.as_uint64(i): metric.as_double(i) for i in range(metric.num_instances())}


def stalls_by_line(action):
    """{(file, line): {stall reason: samples}} over every instruction of one profiled launch."""
    lines = defaultdict(lambda: defaultdict(float))
    for name in action.metric_names():
        if not name.startswith(STALLED) or name.endswith("_not_issued"):
            continue
        for pc, value in per_pc(action, name).items():
            info = action.source_info(pc)
            key = (info.file_name(), info.line()) if info else ("?", 0)
            lines[key][name[len(STALLED):]] += value
    return lines


def source_text(cache, path, line):
    if path not in cache:
        cache[path] = open(path).read().splitlines() if os.path.isfile(path) else []
    text = cache[path]
    return text[line - 1].strip()[:90] if 0 < line <= len(text) else ""


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    ncu_report = import_ncu_report()
    report = ncu_report.load_report(sys.argv[1])
    cache = {}
    for r in range(report.num_ranges()):
        rng = report.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            lines = {key: (sum(reasons.values()), reasons) for key, reasons in stalls_by_line(action).items()}
            total = sum(samples for samples, _ in lines.values())
            print(f"\n### {action.name()} ({int(total)} samples)\n")
            if not total:
                print("no per-instruction samples (was SourceCounters collected?)")
                continue
            print("| file:line | share | main stalls | source |\n|---|---|---|---|")
            for (path, line), (samples, reasons) in sorted(lines.items(), key=lambda kv: -kv[1][0])[:top]:
                main_stalls = sorted(reasons.items(), key=lambda kv: -kv[1])[:2]
                stall = ", ".join(f"{n} {100 * v / samples:.0f}%" for n, v in main_stalls)
                print(f"| {os.path.basename(path)}:{line} | {100 * samples / total:.1f}% | {stall} | "
                      f"`{source_text(cache, path, line)}` |")


if __name__ == "__main__":
    main()
