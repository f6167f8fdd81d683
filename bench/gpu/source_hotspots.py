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


def per_pc(action, name):
    """{pc: value} of an instanced per-instruction metric, or {} when the launch has none."""
    metric = action.metric_by_name(name)
    if metric is None or metric.num_instances() == 0:
        return {}
    pcs = metric.correlation_ids()
    return {pcs.as_uint64(i): metric.as_double(i) for i in range(metric.num_instances())}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    ncu_report = import_ncu_report()
    report = ncu_report.load_report(sys.argv[1])
    sources = {}
    for r in range(report.num_ranges()):
        rng = report.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            names = [n for n in action.metric_names() if n.startswith("smsp__pcsamp_warps_issue_stalled_")
                     and not n.endswith("_not_issued")]
            by_line = defaultdict(float)
            reasons = defaultdict(lambda: defaultdict(float))
            for name in names:
                reason = name[len("smsp__pcsamp_warps_issue_stalled_"):]
                for pc, value in per_pc(action, name).items():
                    info = action.source_info(pc)
                    key = (info.file_name(), info.line()) if info else ("?", 0)
                    if key[0] not in sources:
                        sources[key[0]] = open(key[0]).read().splitlines() if os.path.isfile(key[0]) else []
                    by_line[key] += value
                    reasons[key][reason] += value
            total = sum(by_line.values())
            print(f"\n### {action.name()} ({int(total)} samples)\n")
            if not total:
                print("no per-instruction samples (was SourceCounters collected?)")
                continue
            print("| file:line | share | main stalls | source |\n|---|---|---|---|")
            for key, value in sorted(by_line.items(), key=lambda kv: -kv[1])[:top]:
                stalls = sorted(reasons[key].items(), key=lambda kv: -kv[1])[:2]
                stall = ", ".join(f"{n} {100 * v / value:.0f}%" for n, v in stalls)
                lines = sources.get(key[0], [])
                text = lines[key[1] - 1].strip()[:90] if 0 < key[1] <= len(lines) else ""
                print(f"| {os.path.basename(key[0])}:{key[1]} | {100 * value / total:.1f}% | {stall} | `{text}` |")


if __name__ == "__main__":
    main()
