#!/usr/bin/env python3
"""Files of src/ over 600 lines and functions over 80 (issue 36's bounds:
one role per file, a function readable in one screen).

    python3 scripts/sizes.py [--files N] [--fns N]

Counts every line of a file (tests included: a file's `#[cfg(test)]`
module counts apart, as `tests`), and a function from its `fn` line to its
closing brace. Prints what is over the bounds, largest first; exits 0
either way (a list to work from, not a gate).
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def arg(name, default):
    if name in sys.argv:
        return int(sys.argv[sys.argv.index(name) + 1])
    return default


def strip(line):
    """The line without its comment and string contents (braces in them
    do not count)."""
    line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(?:\\.|[^'\\])'", "''", line)
    return line.split("//", 1)[0]


def functions(lines):
    """(name, first line, length) of each function with a body."""
    found = []
    for i, line in enumerate(lines):
        m = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)", line)
        if not m:
            continue
        depth, opened = 0, False
        for j in range(i, len(lines)):
            code = strip(lines[j])
            if not opened and ";" in code and "{" not in code:
                break  # a declaration without a body
            for c in code:
                if c == "{":
                    depth += 1
                    opened = True
                elif c == "}":
                    depth -= 1
            if opened and depth <= 0:
                found.append((m.group(1), i + 1, j - i + 1))
                break
    return found


def main():
    max_file, max_fn = arg("--files", 600), arg("--fns", 80)
    files, fns = [], []
    for base, _, names in os.walk(ROOT):
        for name in names:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(base, name)
            rel = os.path.relpath(path, os.path.join(ROOT, ".."))
            with open(path, encoding="utf-8") as fh:
                lines = fh.read().split("\n")
            tests = next((i for i, l in enumerate(lines) if l.startswith("#[cfg(test)]")), len(lines))
            if tests > max_file:
                files.append((tests, rel, len(lines) - tests))
            for fn, at, length in functions(lines[:tests]):
                if length > max_fn:
                    fns.append((length, f"{rel}:{at}", fn))
    print(f"files over {max_file} lines (tests apart):")
    for length, rel, tests in sorted(files, reverse=True):
        print(f"  {length:5}  {rel}" + (f"  (+{tests} of tests)" if tests > 1 else ""))
    print(f"functions over {max_fn} lines:")
    for length, at, fn in sorted(fns, reverse=True):
        print(f"  {length:5}  {fn}  {at}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
