#!/usr/bin/env bash
# --save_dir problems fail the job before the first step, with one error line naming the path:
# an empty --save_dir, a file, a path inside a file, a dangling symlink, a read-only or full
# filesystem (tmpfs mounts, when mount is permitted), and a resume whose saves would collide
# with tags already in the directory, a model save that would replace the --init_from file.
# No step runs (the loss CSV stays empty).
source "$(dirname "$0")/lib.sh"
MOUNTS=()
trap 'for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null; done; rm -rf "$WORK"' EXIT

# expect_early_error NAME PATTERN args...: train (2 ranks, 4 steps) fails, its error names
# PATTERN, and no training step ran.
expect_early_error() {
  local name=$1 pattern=$2; shift 2
  if run_train 2 "$name" --config "$CONFIGS/default.json" "${TINY[@]}" --steps 4 --loss_csv "$name.csv" "$@"; then
    fail "$name: exited 0"
  fi
  grep -q 'train: error: ' "$name.err" || { cat "$name.err"; fail "$name: no 'train: error:' line"; }
  grep -qF -- "$pattern" "$name.err" || { cat "$name.err"; fail "$name: error does not say '$pattern'"; }
  if [ -s "$name.csv" ] && [ "$(wc -l < "$name.csv")" -gt 1 ]; then fail "$name: training ran before the error"; fi
  echo "ok: $name: $(grep -m1 'train: error: ' "$name.err")"
}

expect_early_error empty "--save_dir is empty" --save_dir ""
touch afile
expect_early_error file "--save_dir afile exists and is not a directory" --save_dir afile
expect_early_error in_file "--save_dir afile/ckpt cannot be created: afile is not a directory" --save_dir afile/ckpt
ln -s nowhere dangling
expect_early_error dangling "--save_dir dangling is a symbolic link to 'nowhere', which does not exist" --save_dir dangling

mkdir ro full
if mount -t tmpfs -o ro,size=1m tmpfs ro 2>/dev/null; then
  MOUNTS+=(ro)
  expect_early_error read_only "--save_dir ro is not writable: Read-only file system" --save_dir ro
  expect_early_error read_only_sub "--save_dir ro/ckpt cannot be created: Read-only file system" --save_dir ro/ckpt
else
  echo "skipped: read-only filesystem (mount not permitted)"
fi
if mount -t tmpfs -o size=64k tmpfs full 2>/dev/null; then
  MOUNTS+=(full)
  expect_early_error full "--save_dir full has 0.1 MiB free; a checkpoint of this run needs about" --save_dir full
else
  echo "skipped: full filesystem (mount not permitted)"
fi

# Resume from step 2 into the directory that already holds global_step4: the run would save
# global_step4 again at its end.
must_run 2 first --config "$CONFIGS/default.json" "${TINY[@]}" --steps 4 --save_dir ck --save_interval 2
expect_early_error collision "--save_dir ck already holds checkpoint global_step4, which this run would save again at step 4" \
  --load_dir ck --ckpt_id global_step2 --save_dir ck
# The same resume saving elsewhere, or to a step that is free, runs.
must_run 2 other_dir --config "$CONFIGS/default.json" "${TINY[@]}" --steps 4 --load_dir ck --ckpt_id global_step2 --save_dir ck2
[ -f ck2/global_step4/manifest.json ] || fail "no ck2/global_step4"
must_run 2 later --config "$CONFIGS/default.json" "${TINY[@]}" --steps 5 --load_dir ck --save_dir ck
[ "$(cat ck/latest)" = global_step5 ] || fail "ck/latest is '$(cat ck/latest)', expected global_step5"
if ls -a ck ck2 | grep -q '^\.dstrain-write-test'; then fail "a write-test file was left behind"; fi

# The model save (stage3_gather_16bit_weights_on_model_save) would replace the --init_from
# file (spelled another way): refused before the first step, the file untouched.
write_config gather.json "$CONFIGS/default.json" \
  'c.setdefault("zero_optimization", {})["stage3_gather_16bit_weights_on_model_save"] = True'
must_run 2 gather --config gather.json "${TINY[@]}" --steps 1 --save_dir wd
cp wd/model.safetensors before.safetensors
if run_train 2 selfinit --config gather.json "${TINY[@]}" --steps 2 --loss_csv selfinit.csv --save_dir wd \
    --init_from ./wd/model.safetensors; then
  fail "selfinit: exited 0"
fi
grep -qF "would replace wd/model.safetensors, which is this run's --init_from ./wd/model.safetensors" selfinit.err ||
  { cat selfinit.err; fail "selfinit: no error naming both paths"; }
if [ -s selfinit.csv ] && [ "$(wc -l < selfinit.csv)" -gt 1 ]; then fail "selfinit: training ran before the error"; fi
cmp -s before.safetensors wd/model.safetensors || fail "selfinit: the --init_from file changed"
echo "ok: selfinit: $(grep -m1 'train: error: ' selfinit.err)"
must_run 2 otherinit --config gather.json "${TINY[@]}" --steps 2 --save_dir wd2 --init_from wd/model.safetensors
echo "PASS"
