#!/usr/bin/env python3
"""Reads one callgrind dump: prints the instructions it counted, the heap
allocations (calls into the allocator from outside it) and, with --top N,
the N functions with the most instructions of their own; with --callers
NAME, who calls the functions whose name contains NAME (calls, and the
instructions spent in those calls), most first ("alloc": the allocator).

    python3 callgrind_counts.py callgrind.out.1234.2 [--top 25] [--callers memcpy]
    python3 callgrind_counts.py callgrind.out.1234.2 --inside shardgate::trace::

--inside PATTERN also prints `inside N`: the instructions of every call
into a function whose name contains PATTERN from one whose name does not,
whole (what that code costs, called from outside it; code inlined into a
caller is counted as the caller's).

Prints `instructions N` and `allocations N` (one per line), then the top
list. Allocator entry points: mimalloc's (shardgate's global allocator:
the Rust side calls mi_malloc_aligned, mi_zalloc_aligned,
mi_realloc_aligned) and glibc's (nginx and HAProxy: malloc, calloc,
realloc, posix_memalign, memalign, aligned_alloc). A call between two of
them (realloc falling back to malloc) is not counted again.
"""
import re
import sys
from collections import defaultdict

ALLOCATORS = {
    "mi_malloc", "mi_malloc_aligned", "mi_zalloc", "mi_zalloc_aligned",
    "mi_calloc", "mi_realloc", "mi_realloc_aligned", "mi_malloc_aligned_at",
    "malloc", "calloc", "realloc", "posix_memalign", "memalign", "aligned_alloc",
    # glibc's aligned allocations, as callgrind names them (posix_memalign
    # is not seen under its own name).
    "_mid_memalign",
}


def base_name(name):
    # "malloc'2" is callgrind's name for a recursive instance; GCC's
    # clones ("_mid_memalign.constprop.0") are the function itself.
    return re.sub(r"\.(constprop|isra|part|cold)\.\d+$", "", name.split("'")[0].strip())


def read(path, callee=None, inside=None):
    names = {}
    callers = defaultdict(lambda: [0, 0])
    totals = None
    own = defaultdict(int)
    allocations = 0
    entered = 0
    fn = None
    cfn = None
    pending_calls = None
    name_re = re.compile(r"^(c?fn)=\((\d+)\)(?: (.*))?$")
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = name_re.match(line)
            if m:
                kind, ident, name = m.groups()
                if name is not None:
                    names[ident] = name
                name = names.get(ident, ident)
                if kind == "fn":
                    fn = name
                else:
                    cfn = name
                continue
            if line.startswith("calls="):
                pending_calls = int(line[6:].split()[0])
                continue
            if line.startswith("totals:") or line.startswith("summary:"):
                totals = int(line.split()[1])
                continue
            if line and (line[0].isdigit() or line[0] in "+-*"):
                parts = line.split()
                cost = int(parts[1]) if len(parts) > 1 else 0
                if pending_calls is not None:
                    # The line after calls= is the inclusive cost of the call.
                    allocating = base_name(cfn) in ALLOCATORS and base_name(fn) not in ALLOCATORS
                    if allocating:
                        allocations += pending_calls
                    wanted = allocating if callee == "alloc" else callee and callee in cfn
                    if wanted:
                        callers[fn][0] += pending_calls
                        callers[fn][1] += cost
                    if inside and inside in cfn and inside not in fn:
                        entered += cost
                    pending_calls = None
                else:
                    own[fn] += cost
    return totals or sum(own.values()), allocations, own, callers, entered


def main():
    args = sys.argv[1:]
    top, callee, inside = 0, None, None
    if "--top" in args:
        i = args.index("--top")
        top = int(args[i + 1])
        del args[i:i + 2]
    if "--callers" in args:
        i = args.index("--callers")
        callee = args[i + 1]
        del args[i:i + 2]
    if "--inside" in args:
        i = args.index("--inside")
        inside = args[i + 1]
        del args[i:i + 2]
    if len(args) != 1:
        sys.exit(__doc__)
    total, allocations, own, callers, entered = read(args[0], callee, inside)
    print(f"instructions {total}")
    print(f"allocations {allocations}")
    if inside:
        print(f"inside {entered}")
    for name, cost in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {cost:>12} {100 * cost / max(total, 1):5.1f}%  {name[:110]}")
    if callee:
        print(f"callers of {callee}: calls, instructions in them")
        for name, (calls, cost) in sorted(callers.items(), key=lambda kv: -kv[1][0])[:40]:
            print(f"  {calls:>9} {cost:>12}  {name[:120]}")


if __name__ == "__main__":
    main()
