#!/usr/bin/env python3
"""The longest Rust functions under the given folders, for reviews of structure.

    python3 scripts/fn_lengths.py learner/src actor/src server/src [--most 15] [--over N]

A function's length is the lines from its `fn` line to its closing brace, doc comments
excluded; `#[cfg(test)]` modules and `tests/` folders are left out, since tests are
allowed to be long. Braces inside strings, chars and comments are skipped, which is all
the parsing the workspace's code needs (no macro bodies hold a `fn`'s own braces).
With `--over N` it exits 1 if any function is longer than N lines.
"""

import argparse
import pathlib
import re
import sys

FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?"
                r"(?:extern\s+\"[^\"]*\"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")


def code_only(text):
    """The text with comments, strings and chars blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 40]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    text = code_only(path.read_text(encoding="utf-8"))
    lines = text.split("\n")
    # Blank #[cfg(test)] modules.
    skip = set()
    for k, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]" and k + 1 < len(lines) and re.match(r"\s*(pub\s+)?mod\s+\w+\s*\{", lines[k + 1]):
            depth, j = 0, k + 1
            while j < len(lines):
                depth += lines[j].count("{") - lines[j].count("}")
                skip.add(j)
                if depth <= 0 and "{" in "".join(lines[k + 1:j + 1]):
                    break
                j += 1
    for k, line in enumerate(lines):
        if k in skip:
            continue
        m = FN.match(line)
        if not m:
            continue
        depth, j, opened = 0, k, False
        while j < len(lines):
            seg = lines[j]
            if not opened and ";" in seg and "{" not in seg:
                break  # a declaration without a body
            for ch in seg:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if opened and depth == 0:
                yield m.group(1), k + 1, j - k + 1
                break
            j += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--most", type=int, default=15)
    ap.add_argument("--over", type=int)
    args = ap.parse_args()
    rows = []
    for d in args.dirs:
        for p in sorted(pathlib.Path(d).rglob("*.rs")):
            if "tests" in p.parts or "benches" in p.parts:
                continue
            rows += [(n, f"{p}:{line}", name) for name, line, n in functions(p)]
    rows.sort(key=lambda r: -r[0])
    for n, where, name in rows[:args.most]:
        print(f"{n:5}  {name:32} {where}")
    if args.over is not None:
        over = [r for r in rows if r[0] > args.over]
        if over:
            print(f"{len(over)} function(s) over {args.over} lines", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
