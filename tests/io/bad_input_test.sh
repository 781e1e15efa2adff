#!/bin/bash
# Engine-level load errors leave the training state untouched (parameters, counters, lr):
# corrupt shard (checksum), truncated shard, a different model (names/shapes listed),
# a different format version, a missing tag directory. usage: bad_input_test.sh NP
set -euo pipefail
NP=$1
source "$(dirname "$0")/lib.sh"
BIN=$CKPT_DRIVER
scratch_dir bad
MPI="$MPIRUN -np $NP"
$MPI "$BIN" --dir "$D" --steps 2 --save-at 2 --combos fp16:1 >/dev/null
CK="$D/fp16_z1/ckpt"
cp -r "$CK/global_step2" "$D/pristine"
restore() { rm -rf "$CK/global_step2"; cp -r "$D/pristine" "$CK/global_step2"; }
run() { $MPI "$BIN" --dir "$D" --combos fp16:1 --load-must-fail "$@"; }
# 1. flip bytes inside the data of fp32_master of the last rank's shard
LAST=$((NP - 1))
flip_byte "$CK/global_step2/zero_rank_$LAST.h5" fp32_master
run "checksum mismatch in $CK/global_step2/zero_rank_$LAST.h5 dataset 'fp32_master'"
restore
# 2. truncated shard
$DS_SYSTEM_PYTHON -c "import os,sys; p=sys.argv[1]; os.truncate(p, os.path.getsize(p)//2)" "$CK/global_step2/zero_rank_0.h5"
run "zero_rank_0.h5"
restore
# 3. a different model (hidden 7 instead of 5): shapes listed
run "shape differs: l1.weight checkpoint [5,6] model [7,6]" --hidden 7
# 4. a different format version
sed -i 's/"format_version": 1/"format_version": 2/' "$CK/global_step2/manifest.json"
run "has format_version 2; this dstrain reads format_version 1"
restore
# 5. missing tag directory
echo -n global_step9 > "$CK/latest"
run "checkpoint tag 'global_step9' not found"
echo "bad_input_test: OK"
