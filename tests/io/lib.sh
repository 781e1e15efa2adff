# Shared setup of the checkpoint script tests (sourced; defines names, runs nothing): a scratch
# directory removed on exit, the save of a small one-rank checkpoint by ckpt_driver, and a
# byte flip inside one dataset. ctest sets DS_BINARY_DIR, DS_MPIEXEC and DS_SYSTEM_PYTHON.
CKPT_DRIVER=$DS_BINARY_DIR/tests/io/ckpt_driver
TO_FP32=$DS_BINARY_DIR/apps/ds_to_fp32/ds_to_fp32
MPIRUN="$DS_MPIEXEC --oversubscribe --bind-to none"

# scratch_dir NAME: D is a fresh /tmp/ds_ckpt_NAME.XXXXXX, removed when the script exits.
scratch_dir() {
  D=$(mktemp -d "/tmp/ds_ckpt_$1.XXXXXX")
  trap 'rm -rf "$D"' EXIT
}

# save_small_checkpoint: one rank, fp32, ZeRO 0, two steps saved at step 2, under $D;
# CK is the checkpoint directory (its tag is global_step2).
save_small_checkpoint() {
  $MPIRUN -np 1 "$CKPT_DRIVER" --dir "$D" --steps 2 --save-at 2 --combos fp32:0 >/dev/null
  CK="$D/fp32_z0/ckpt"
}

# flip_byte FILE DATASET: inverts one byte inside DATASET's data in the HDF5 file FILE (h5py
# finds where), so the file still opens and only the checksum can tell.
flip_byte() {
  "$DS_SYSTEM_PYTHON" - "$1" "$2" <<'PY'
import sys, h5py
path, name = sys.argv[1:3]
with h5py.File(path, "r") as f:
    off = f[name].id.get_offset()
with open(path, "r+b") as f:
    f.seek(off + 4)
    b = f.read(1)
    f.seek(off + 4)
    f.write(bytes([b[0] ^ 0xFF]))
PY
}
