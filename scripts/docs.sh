#!/usr/bin/env bash
# Builds the documentation site (docs/, mdBook) and checks every link in it and in the
# top-level Markdown files: run by scripts/test.sh, so CI fails on a broken link.
#
#   scripts/docs.sh            # build into a temporary directory and check
#   scripts/docs.sh --open     # ... and print where the built site is
#
# mdBook is installed once (cargo install, pinned, without its server) into
# ~/.cache/millrace/tools, outside the clone like the virtualenv.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/env.sh"
cd "$here/.."
mdbook_version=0.5.4
tools="$MILLRACE_CACHE/tools"
mdbook="$tools/bin/mdbook"
if [[ ! -x "$mdbook" ]] || [[ "$("$mdbook" --version)" != "mdbook v$mdbook_version" ]]; then
    echo "docs: installing mdbook $mdbook_version into $tools (once, about 3 minutes)" >&2
    CARGO_TARGET_DIR="$MILLRACE_CACHE/tools-target" cargo install --quiet --locked \
        --root "$tools" --version "$mdbook_version" --no-default-features --features search mdbook
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
if ! "$mdbook" build docs --dest-dir "$out/site" >"$out/build.log" 2>&1; then
    cat "$out/build.log" >&2
    echo "docs: mdbook build failed" >&2
    exit 1
fi
# Warnings are failures too (a chapter mdBook could not render as written).
if grep -E 'WARN|ERROR' "$out/build.log" >&2; then
    echo "docs: mdbook warned (above)" >&2
    exit 1
fi
python3 "$here/check_links.py" --site "$out/site" README.md CHANGELOG.md BENCHMARKS.md docs
if [[ "${1:-}" == "--open" ]]; then
    keep="$MILLRACE_CACHE/book"
    rm -rf "$keep" && cp -r "$out/site" "$keep"
    echo "docs: the site is in $keep/index.html"
fi
