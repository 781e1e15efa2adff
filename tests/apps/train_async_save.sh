#!/usr/bin/env bash
# checkpoint.async_save in train: the last save is committed before train reports success
# (`latest` names it, no tmp directory is left, the "saved checkpoint" line is printed), also
# with the default --save_interval 0 where the end-of-run save is the only one.
source "$(dirname "$0")/lib.sh"

write_config async.json "$CONFIGS/default.json" 'c["checkpoint"] = {"async_save": True}'

check_saved() {  # DIR OUT TAG...: DIR/latest is the last TAG, every TAG committed and reported
  local dir=$1 out=$2; shift 2
  local last=${!#}
  [ "$(cat "$dir/latest" 2>/dev/null)" = "$last" ] || fail "$dir/latest is '$(cat "$dir/latest" 2>/dev/null)', expected $last (entries: $(ls "$dir"))"
  for t in "$@"; do
    [ -f "$dir/$t/manifest.json" ] || fail "$dir/$t was not committed (entries: $(ls "$dir"))"
    grep -q "saved checkpoint $dir/$t\$" "$out.out" || { cat "$out.out"; fail "no 'saved checkpoint $dir/$t' line"; }
  done
  if ls "$dir" | grep -q '\.tmp-'; then fail "tmp directory left in $dir: $(ls "$dir")"; fi
}

must_run 2 end_only --config async.json "${TINY[@]}" --steps 3 --save_dir ck_end
check_saved ck_end end_only global_step3

must_run 2 every2 --config async.json "${TINY[@]}" --steps 5 --save_dir ck_every --save_interval 2
check_saved ck_every every2 global_step2 global_step4 global_step5

# The committed async checkpoint resumes like a synchronous one.
must_run 2 resumed --config async.json "${TINY[@]}" --steps 6 --load_dir ck_every --save_dir ck_every
grep -q 'resumed from ck_every/global_step5 at step 5' resumed.out || { cat resumed.out; fail "no resume from global_step5"; }
check_saved ck_every resumed global_step6
echo "PASS"
