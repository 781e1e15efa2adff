#!/bin/bash
# Every relative link in README.md and docs/**/*.md resolves: the file exists, and a #anchor
# names a heading of the target page (GitHub's heading ids). Links to other sites are not
# followed; code blocks are skipped.
# usage: doc_links.sh [SOURCE_DIR]   (default: $DS_SOURCE_DIR, as ctest sets it)
set -euo pipefail
root=${1:-${DS_SOURCE_DIR:?run through ctest or give the source directory}}
"${DS_SYSTEM_PYTHON:-python3}" - "$root" <<'PYEOF'
import glob, os, re, sys

root = sys.argv[1]
pages = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))

def without_blocks(text):
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)

def without_code(text):
    return re.sub(r"`[^`\n]*`", "", without_blocks(text))

def heading_ids(path):
    # GitHub: lower case, drop what is not a letter, digit, space, '-' or '_', spaces -> '-';
    # a repeated id gets -1, -2, ...
    ids, seen = set(), {}
    for line in without_blocks(open(path, encoding="utf-8").read()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(base, 0)
        seen[base] = n + 1
        ids.add(base if n == 0 else f"{base}-{n}")
    return ids

errors = []
for page in pages:
    for link in re.findall(r"\]\(([^)\s]+)\)", without_code(open(page, encoding="utf-8").read())):
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", link):
            continue  # https:, mailto:, ...
        path, _, anchor = link.partition("#")
        target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        where = os.path.relpath(page, root)
        if not os.path.exists(target):
            errors.append(f"{where}: link '{link}': {os.path.relpath(target, root)} does not exist")
        elif anchor and target.endswith(".md") and anchor not in heading_ids(target):
            errors.append(f"{where}: link '{link}': {os.path.relpath(target, root)} has no heading '#{anchor}'")
if errors:
    sys.exit("\n".join("FAIL: " + e for e in errors))  # exit status 1
print(f"ok: every relative link in {len(pages)} pages resolves")
PYEOF
