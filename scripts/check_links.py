"""Checks the documentation's links, so that none is broken on a forge or in the site.

    python3 scripts/check_links.py [--site BUILT_BOOK] FILE_OR_DIR...

For every Markdown file given (directories: their *.md, recursively):
- each relative link and image resolves to a file in the repository, and a `#anchor`
  to a heading of the target (GitHub's and mdBook's heading ids);
- a page under docs/ links only within docs/ (the site holds nothing else), and no
  file names a path outside the repository;
- every page under docs/ is in docs/SUMMARY.md (else the site leaves it out), but
  the measurements' own files in docs/results/data/.
With --site, the built mdBook too: every relative href and src resolves to a file of
the site and every #fragment to an id in it. Exits 1 listing every problem.
"""

import html.parser
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
OUTSIDE = re.compile(r"\.\./shared|/work/|\.\./\.\./\.\./")


def slug(heading: str) -> str:
    """A heading's id as GitHub and mdBook make it from its text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.replace("`", "").replace("*", "")
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "-_":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def prose(lines):
    """The lines outside fenced code blocks, with inline code spans blanked."""
    fenced = False
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield n, re.sub(r"`[^`]*`", "``", line)


def anchors(path: Path, cache={}):
    """The ids of a page's headings (a repeated heading's get -1, -2, ...)."""
    if path not in cache:
        seen, ids, fenced = {}, set(), False
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            m = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(1))
                k = seen.get(base, 0)
                ids.add(base if k == 0 else f"{base}-{k}")
                seen[base] = k + 1
        cache[path] = ids
    return cache[path]


def check_markdown(files):
    problems = []
    for f in files:
        lines = f.read_text().splitlines()
        rel = f.relative_to(ROOT)
        for n, line in enumerate(lines, 1):
            if OUTSIDE.search(line):
                problems.append(f"{rel}:{n}: names a path outside the repository")
        for n, line in prose(lines):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # http:, https:, mailto:
                path, _, frag = target.partition("#")
                dest = (f.parent / path).resolve() if path else f
                if not str(dest).startswith(str(ROOT)):
                    problems.append(f"{rel}:{n}: {target}: outside the repository")
                    continue
                if not dest.exists():
                    problems.append(f"{rel}:{n}: {target}: no such file")
                    continue
                if DOCS in f.parents and DOCS not in dest.parents:
                    problems.append(f"{rel}:{n}: {target}: a docs page links outside docs/ (the site would not have it)")
                if frag and dest.suffix == ".md" and frag not in anchors(dest):
                    problems.append(f"{rel}:{n}: {target}: no heading #{frag} in {dest.relative_to(ROOT)}")
    summary = (DOCS / "SUMMARY.md").read_text()
    listed = {(DOCS / p).resolve() for p in re.findall(r"\]\(([^)]+\.md)\)", summary)}
    for page in sorted(DOCS.rglob("*.md")):
        data = DOCS / "results" / "data"  # the measurements' files, not pages
        if page.name != "SUMMARY.md" and data not in page.parents and page.resolve() not in listed:
            problems.append(f"{page.relative_to(ROOT)}: not in docs/SUMMARY.md")
    return problems


class Refs(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for key in ("href", "src"):
            if a.get(key):
                self.refs.append(a[key])


def check_site(site: Path):
    problems, pages = [], {}
    for page in site.rglob("*.html"):
        p = Refs()
        p.feed(page.read_text(errors="replace"))
        pages[page.resolve()] = p
    for page, p in pages.items():
        for ref in p.refs:
            if re.match(r"[a-z]+:|//", ref) or ref.startswith("#") and not ref[1:]:
                continue
            path, _, frag = ref.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                problems.append(f"site {page.relative_to(site.resolve())}: {ref}: no such file")
            elif frag and dest.suffix == ".html" and frag not in pages[dest].ids:
                problems.append(f"site {page.relative_to(site.resolve())}: {ref}: no id #{frag}")
    return problems


def main() -> int:
    args = sys.argv[1:]
    site = None
    if args[:1] == ["--site"]:
        site, args = Path(args[1]), args[2:]
    files = []
    for a in args:
        p = (ROOT / a).resolve()
        files.extend(sorted(p.rglob("*.md")) if p.is_dir() else [p])
    problems = check_markdown(files)
    if site:
        problems += check_site(site)
    for p in problems:
        print(f"broken: {p}", file=sys.stderr)
    if problems:
        print(f"check_links: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"check_links: {len(files)} Markdown files{' and the site' if site else ''}: every link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
