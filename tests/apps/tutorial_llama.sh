#!/bin/bash
# docs/user/tutorial-llama.md, run as written: its `bash` blocks in order (with a tiny model:
# the flags below shrunk, mpirun given the test's launcher) and its `python` block saved under
# the name its first line gives, in a directory where build/, configs/, scripts/ and src/ are
# the repository's. Then the logits the tutorial's PyTorch script wrote must be dstrain's own
# (hf_logits --llama: ds::nn::Llama loaded as train --init_from loads) within 1e-4 of the
# largest. Exit 77 (skipped) only when torch is missing, after everything before the PyTorch step ran.
source "$(dirname "$0")/lib.sh"
DOC=$DS_SOURCE_DIR/docs/user/tutorial-llama.md
LOGITS=$DS_BINARY_DIR/tests/io/hf_logits
[ -x "$LOGITS" ] || fail "$LOGITS not built"
ln -s "$DS_BINARY_DIR" build
for d in configs scripts src; do ln -s "$DS_SOURCE_DIR/$d" "$d"; done

# Blocks: ```bash lines go to tutorial.sh; a ```python block to the file named by its first line.
awk -v dir="$PWD" '
  /^```bash$/ { mode = "bash"; next }
  /^```python$/ { mode = "python"; file = ""; next }
  /^```/ { mode = ""; next }
  mode == "bash" { print > (dir "/tutorial.sh") }
  mode == "python" {
    if (file == "") { split($2, a, ":"); file = dir "/" a[1] }
    print > file
  }' "$DOC"
[ -s tutorial.sh ] && [ -s llama_logits.py ] || fail "no bash blocks or no llama_logits.py block in $DOC"

# shrink OLD NEW: the tutorial's command text OLD (exactly once) becomes NEW.
shrink() {
  [ "$(grep -o -F -- "$1" tutorial.sh | wc -l)" = 1 ] || fail "'$1' is not in $DOC's commands exactly once: update this test"
  sed -i "s|$1|$2|" tutorial.sh
}
shrink "--merges 1000" "--merges 100"
shrink "--n_layer 4" "--n_layer 2"
shrink "--n_embd 128" "--n_embd 32"
shrink "--block_size 64" "--block_size 16"
shrink "--steps 300" "--steps 3"
shrink "mpirun -np 2" "$MPIEXEC --oversubscribe --bind-to none -np 2"

# scripts/bpe_train.py's refusals: one line naming the flag.
"$PY" "$DS_SOURCE_DIR/scripts/bpe_train.py" --input nope.txt --merges 1 --output t 2>err.txt && fail "bpe_train.py read nope.txt"
grep -qx "bpe_train.py: error: --input nope.txt: No such file or directory" err.txt || fail "bpe_train.py: $(cat err.txt)"
"$PY" "$DS_SOURCE_DIR/scripts/bpe_train.py" --input tutorial.sh --merges -1 --output t 2>err.txt && fail "bpe_train.py took --merges -1"
grep -qx "bpe_train.py: error: --merges must be >= 0, got -1" err.txt || fail "bpe_train.py: $(cat err.txt)"

# Without torch: everything up to the PyTorch step, then skip.
if ! "$PY" -c "import torch" 2>/dev/null; then
  grep -v "^python3 llama_logits.py" tutorial.sh >no_torch.sh
  PATH=$(dirname "$PY"):$PATH bash -euo pipefail no_torch.sh >run.out 2>&1 || { tail -n 40 run.out; fail "the tutorial's commands"; }
  [ -s tut/llama.safetensors ] || fail "no tut/llama.safetensors"
  echo "SKIP: $PY cannot import torch (the tutorial ran up to its PyTorch step)"
  exit 77
fi
PATH=$(dirname "$PY"):$PATH bash -euo pipefail tutorial.sh >run.out 2>&1 || { tail -n 40 run.out; fail "the tutorial's commands"; }
grep -q "^bpe_train.py: 100 merges, vocab size 357" run.out || fail "bpe_train line: $(grep bpe_train run.out)"
grep -q "^dstok: .* vocab size 357, uint16 tokens (version 1)$" run.out || fail "dstok summary: $(grep dstok run.out)"
grep -q "model: llama n_layer=2 n_head=4 n_kv_head=2 n_embd=32 .* vocab_size=357" run.out || fail "model line: $(grep model: run.out)"
grep -q "^\[train\] sample" run.out || fail "no sample"
grep -q "^ds_to_fp32: wrote 21 fp32 tensors" run.out || fail "export line: $(grep ds_to_fp32 run.out)"
grep -q "^next-token loss over the first 64 tokens: " run.out || fail "no torch loss line"

# dstrain's logits of the same 64 tokens.
TOKENS=$("$PY" -c "import struct,sys; print(','.join(map(str, struct.unpack('<64H', open(sys.argv[1],'rb').read()[1024:1152]))))" tut/text_000000.bin)
"$LOGITS" --llama tut/llama.safetensors 4 10000 1e-5 "$TOKENS" >ds_logits.txt
"$PY" - ds_logits.txt tut/torch_logits.txt <<'PYEOF'
import sys
a = [[float(v) for v in l.split()] for l in open(sys.argv[1])]
b = [[float(v) for v in l.split()] for l in open(sys.argv[2])]
assert len(a) == len(b) == 64 and all(len(x) == len(y) == 357 for x, y in zip(a, b)), (len(a), len(b))
err = max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
scale = max(abs(y) for rb in b for y in rb)
print(f"max |dstrain - torch| = {err:.3g}, max |torch| = {scale:.3g}")
assert err <= 1e-4 * scale, "the tutorial's PyTorch logits differ from dstrain's"
PYEOF
echo "PASS"
