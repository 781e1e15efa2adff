#!/usr/bin/env bash
# Every file in configs/ (globbed now, so configs added later are covered) must pass
# `ds_config check FILE --world_size 2`. Usage: check_configs.sh <path to ds_config>
set -u
APP=$1
ROOT=${DS_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
shopt -s nullglob
files=("$ROOT"/configs/*.json)
if [ ${#files[@]} -eq 0 ]; then
  echo "no files in $ROOT/configs; nothing to check"
  exit 0
fi
fails=0
for f in "${files[@]}"; do
  if out=$("$APP" check "$f" --world_size 2 2>&1 >/dev/null); then
    echo "ok   $f${out:+ (stderr: $out)}"
  else
    echo "FAIL $f: $out"
    fails=$((fails + 1))
  fi
done
[ "$fails" -eq 0 ] || { echo "$fails config(s) failed"; exit 1; }
