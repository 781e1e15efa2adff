#!/bin/bash
# docs/user/environment.md lists exactly the registry's variables (src/core/src/env_table.cpp),
# in its order, with the same class, type and default: `ds_report --env --json` against the
# doc's table. A variable added to the table without a row here fails.
# usage: environment_doc.sh
set -euo pipefail
: "${DS_SOURCE_DIR:?run through ctest}" "${DS_BINARY_DIR:?run through ctest}"
report=$DS_BINARY_DIR/apps/ds_report/ds_report
[ -x "$report" ] || { echo "FAIL: $report not built"; exit 1; }
json=$(env -i PATH=/usr/bin:/bin "$report" --env --json)
"${DS_SYSTEM_PYTHON:-python3}" - "$DS_SOURCE_DIR/docs/user/environment.md" "$json" <<'PYEOF'
import json, re, sys
doc_path, report = sys.argv[1], json.loads(sys.argv[2])
table = [(v["name"], v["class"], v["type"], v["default"] or "") for v in report["environment"]]
rows, section = [], None
for line in open(doc_path):
    if line.startswith("## "):
        section = line[3:].strip()
    if section == "The variables" and line.startswith("| `"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        clean = lambda c: "" if c == '""' else c.strip("`")
        rows.append((clean(cells[0]), cells[1], cells[2], clean(cells[3])))
errors = []
names_doc, names_table = [r[0] for r in rows], [t[0] for t in table]
for n in names_table:
    if n not in names_doc:
        errors.append(f"{n} is in the registry but has no row in docs/user/environment.md")
for n in names_doc:
    if n not in names_table:
        errors.append(f"{n} has a row in docs/user/environment.md but is not in the registry")
doc = {r[0]: r for r in rows}
for t in table:
    if t[0] in doc and doc[t[0]] != t:
        errors.append(f"{t[0]}: doc says class/type/default {doc[t[0]][1:]}, the registry {t[1:]}")
common = [n for n in names_table if n in doc]
if not errors and [n for n in names_doc if n in names_table] != common:
    errors.append("the doc's rows are not in the registry's order")
for e in errors:
    print("FAIL:", e)
if errors:
    sys.exit(1)
print(f"ok: docs/user/environment.md matches the registry ({len(table)} variables)")
PYEOF
