#!/bin/bash
# scripts/long_functions.py on small fixtures: a function over the limit is listed (exit 1),
# one whose comment says "Long on purpose:" is not, and a constructor's body after a
# member{value} initializer counts from its signature.
# usage: long_functions_test.sh
set -uo pipefail
cd "${DS_SOURCE_DIR:?run through ctest}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
body() { for _ in $(seq 1 "$1"); do echo "  x += 1;"; done; }

{ echo "int x = 0;"; echo "void long_one() {"; body 79; echo "}"; echo "void short_one() { x = 2; }"; } >"$dir/a.cpp"
out=$(python3 scripts/long_functions.py "$dir"); rc=$?
[ "$rc" -eq 1 ] || fail "exit $rc for an 81-line function, expected 1: $out"
grep -qF "a.cpp:2: 81 lines: void long_one()" <<<"$out" || fail "long_one not listed as a.cpp:2, 81 lines: $out"
grep -q "short_one" <<<"$out" && fail "short_one listed: $out"

{ echo "int x = 0;"; echo "// A table of cases."; echo "// Long on purpose: reads best whole."; echo "void kept() {"
  body 90; echo "}"; } >"$dir/a.cpp"
out=$(python3 scripts/long_functions.py "$dir"); rc=$?
[ "$rc" -eq 0 ] || fail "exit $rc with the reason given, expected 0: $out"
grep -qF "(reason given)" <<<"$(python3 scripts/long_functions.py --all "$dir")" || fail "--all does not list it"

{ echo "struct A { int b_, c_; A(); };"; echo "A::A() : b_{1},"; echo "         c_{2} {"; echo "  int x = 0;"
  body 80; echo "}"; } >"$dir/a.cpp"
out=$(python3 scripts/long_functions.py "$dir")
grep -qF "a.cpp:2: 84 lines: A::A()" <<<"$out" || fail "the constructor's body is not counted from line 2: $out"
echo "ok: long_functions.py lists long functions, accepts a reason, counts constructors whole"
