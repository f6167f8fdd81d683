#!/usr/bin/env python3
"""Static PTX instruction counts of one kernel, per line of its own source file.

A check that needs nvcc but no GPU (DEVELOPERS.md, "Checks that need no GPU"): compile a .cu file to PTX
with -lineinfo, then

    python3 bench/gpu/ptx_lines.py k.ptx 'vector_scores_backward_kernelI13__nv_bfloat16Lb1' [rows]

prints the kernel's instruction count and its heaviest source lines, each with its commonest opcodes.
Code that other functions inline is counted at the kernel file's line that calls it (PTX's inlined_at),
so a helper's cost shows where the kernel uses it. The counts are static: a loop counts once, however
many times it runs, and ptxas still rewrites the PTX, so compare two versions of one kernel with them
rather than read them as time.
"""
import collections
import re
import sys


def kernel_body(ptx, pattern):
    """The text of the first .entry whose mangled name matches pattern."""
    for part in re.split(r'\n(?=(?:\.visible |\.weak )?\.entry )', ptx):
        head = part.lstrip()
        if head.startswith(('.entry', '.visible .entry', '.weak .entry')) and re.search(pattern, head.split('(')[0]):
            return part
    sys.exit(f'ptx_lines: no kernel matching {pattern!r}')


def count(body):
    """Instructions by (file, line) of the outermost caller, and their opcodes."""
    where, lines, ops = None, collections.Counter(), collections.defaultdict(collections.Counter)
    for raw in body.split('\n'):
        s = raw.strip()
        loc = re.match(r'\.loc\s+(\d+) (\d+) \d+(?:.*inlined_at (\d+) (\d+) \d+)?', s)
        if loc:
            f, l, fi, li = loc.groups()
            where = (int(fi), int(li)) if fi else (int(f), int(l))
            continue
        if not s or s.startswith(('//', '.', '{', '}', '$')) or s.endswith(':'):
            continue
        words = s.split()
        op = words[1] if words[0].startswith('@') and len(words) > 1 else words[0]
        lines[where] += 1
        ops[where][op.split('.')[0]] += 1
    return lines, ops


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ptx = open(sys.argv[1]).read()
    files = dict(re.findall(r'\.file\s+(\d+) "([^"]+)"', ptx))
    lines, ops = count(kernel_body(ptx, sys.argv[2]))
    rows = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    print(f'{sum(lines.values())} instructions')
    for (f, l), n in lines.most_common(rows) if rows else []:
        name = files.get(str(f), '?').split('/')[-1]
        top = ', '.join(f'{op} {k}' for op, k in ops[(f, l)].most_common(5))
        print(f'{n:6d}  {name}:{l}  ({top})')


if __name__ == '__main__':
    main()
