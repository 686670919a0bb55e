#!/usr/bin/env python3
"""The import arrows between shardgate's top-level modules, drawn from the
`crate::` paths in src/ (comments and doc comments left out), and the
circles among them, and any arrow that points up the layers.

    python3 scripts/imports.py          # arrows, circles, arrows up; exit 1 on either
    python3 scripts/imports.py --dot    # the graph for graphviz

A top-level module is `src/<name>.rs` or `src/<name>/`; `main.rs` and
`lib.rs` are the crate's roots and draw no arrows. An arrow A -> B means
some file of A names `crate::B`. A circle is a set of modules each reaching
every other (a strongly connected component of more than one module).

LAYERS places every module, top first; an arrow must point to a lower
layer (peers on one layer import nothing of each other). A new module is
placed here, where its imports say it belongs.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")

LAYERS = [
    ["server"],
    ["admin"],
    # The collector, and the background services that act on Control.
    ["collector", "services", "health", "state"],
    ["proxy"],
    ["control"],
    ["tls"],
    ["cluster"],
    ["dns", "hooks"],
    ["config"],
    ["trace", "metrics", "access_log"],
    ["summary"],
    ["routing"],
    ["limits"],
    # Pure rules every layer may use.
    ["counters", "capped", "wire", "alloc_counts", "allocator"],
]


def modules():
    """Each top-level module with its files."""
    found = {}
    for entry in sorted(os.listdir(ROOT)):
        path = os.path.join(ROOT, entry)
        if entry.endswith(".rs") and entry not in ("main.rs", "lib.rs"):
            found.setdefault(entry[:-3], []).append(path)
        elif os.path.isdir(path):
            for base, _, files in os.walk(path):
                found.setdefault(entry, []).extend(
                    os.path.join(base, f) for f in sorted(files) if f.endswith(".rs")
                )
    # A folder of no Rust (the page's `ui/`) is no module.
    return {m: files for m, files in found.items() if files}


def code(text):
    """`text` without comments and string literals (a path in a string or
    a doc comment is no import). One pass, so that a `//` inside a string,
    a quote in a character literal or a string over several lines is read
    as the compiler reads it."""
    token = re.compile(
        r'//[^\n]*|/\*.*?\*/|r(#*)".*?"\1|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])\'',
        re.S,
    )

    def blank(m):
        if m.group(0).startswith("/"):
            return " "
        return '""' if m.group(0).startswith(("\"", "r")) else "' '"

    return token.sub(blank, text)


def named(text):
    """The top-level modules a file's code names through `crate::`."""
    names = set()
    for m in re.finditer(r"\bcrate::(\{|[a-z_][a-z0-9_]*)", text):
        if m.group(1) != "{":
            names.add(m.group(1))
            continue
        # `crate::{a, b::c, d::{e, f}}`: the first name of each item.
        depth, item, at = 1, "", m.end()
        while at < len(text) and depth:
            c = text[at]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            if depth == 1 and c == ",":
                item = ""
            elif depth == 1 and c not in "{}":
                item += c
                first = re.match(r"\s*([a-z_][a-z0-9_]*)", item)
                if first and re.match(r"\s*[a-z_][a-z0-9_]*\s*(::|,|$)", item + ","):
                    names.add(first.group(1))
            at += 1
    return names


def circles(graph):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    mods = modules()
    graph = {m: set() for m in mods}
    why = {}
    for m, files in mods.items():
        for f in files:
            with open(f, encoding="utf-8") as fh:
                for target in named(code(fh.read())):
                    if target in mods and target != m:
                        graph[m].add(target)
                        why.setdefault((m, target), os.path.relpath(f, os.path.join(ROOT, "..")))
    if "--dot" in sys.argv:
        print("digraph shardgate {")
        for m in sorted(graph):
            for t in sorted(graph[m]):
                print(f'  "{m}" -> "{t}";')
        print("}")
        return 0
    for m in sorted(graph):
        if graph[m]:
            print(f"{m} -> {', '.join(sorted(graph[m]))}")
    found = circles(graph)
    for component in found:
        print(f"\ncircle: {' <-> '.join(component)}")
        for a in component:
            for b in sorted(graph[a]):
                if b in component:
                    print(f"  {a} -> {b}  (e.g. {why[(a, b)]})")
    rank = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    unplaced = sorted(m for m in graph if m not in rank)
    if unplaced:
        print(f"\nnot in LAYERS: {', '.join(unplaced)}")
    up = [
        (a, b)
        for a in sorted(graph)
        for b in sorted(graph[a])
        if a in rank and b in rank and rank[b] <= rank[a]
    ]
    for a, b in up:
        print(f"\nnot down the layers: {a} -> {b}  (e.g. {why[(a, b)]})")
    if found or unplaced or up:
        return 1
    print("\nno circles; every arrow points down the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
