#!/bin/bash
# train --tokenizer: the sample's prompt (--prompt) is encoded and the sample decoded with the
# BPE tokenizer; the model gets the tokenizer's vocab size when the config sets none, and a
# model.vocab_size below it is one clear error.
source "$(dirname "$0")/../apps/lib.sh"

# A tokenizer whose byte tokens have id == byte value (so the embedded corpus's byte tokens
# decode to the same text) and three merges: " t" (256), "he" (257), " the" (258); then
# <|endoftext|> (259).
"$PY" - tok <<'PYEOF'
import json, os, sys
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
b2u = dict(zip(bs, map(chr, cs)))
vocab = {b2u[b]: b for b in range(256)}
merges = [(b2u[32], "t"), ("h", "e"), (b2u[32] + "t", "he")]
for a, b in merges:
    vocab[a + b] = len(vocab)
vocab["<|endoftext|>"] = len(vocab)
os.makedirs(sys.argv[1])
json.dump(vocab, open(os.path.join(sys.argv[1], "vocab.json"), "w"), ensure_ascii=False)
open(os.path.join(sys.argv[1], "merges.txt"), "w").write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
PYEOF

# "the cat sat" -> "the" [t, he], " cat" [Ġ, c, a, t], " sat" [Ġ, s, a, t]: 10 tokens.
must_run 1 prompt --config "$CONFIGS/default.json" "${TINY[@]}" --steps 2 --tokenizer tok --prompt "the cat sat"
grep -aq "vocab_size=260" prompt.out || fail "the model did not get the tokenizer's vocab size: $(grep -m1 model prompt.out)"
grep -a -A1 -F "[train] sample (temperature 0.8, prompt = --prompt, 10 tokens):" prompt.out | tail -n 1 | grep -aq "^the cat sat" ||
  fail "no decoded --prompt sample: $(grep -A2 'sample' prompt.out)"
grep -aq "^\[train\] end of sample" prompt.out || fail "no end of sample line"

must_run 1 default --config "$CONFIGS/default.json" "${TINY[@]}" --steps 2 --tokenizer tok
grep -aq -F "[train] sample (temperature 0.8, prompt = first 16 tokens of the validation split):" default.out ||
  fail "no validation-split sample: $(grep -A2 'sample' default.out)"

# Without --tokenizer the byte-level sample line is unchanged.
must_run 1 bytes --config "$CONFIGS/default.json" "${TINY[@]}" --steps 2
grep -aq -F "[train] sample (temperature 0.8, prompt = first 16 bytes of the validation split):" bytes.out ||
  fail "byte-level sample line changed: $(grep -A2 'sample' bytes.out)"

# llm.c shards written by dstok train with the same tokenizer, and its sample is decoded.
"$DS_BINARY_DIR/apps/dstok/dstok" encode --tokenizer tok --input "$DS_SOURCE_DIR/src/data/corpus/licenses.txt" \
  --output shard --shard_tokens 20000 --threads 2 >dstok.out || fail "dstok encode: $(cat dstok.out)"
must_run 1 shards --config "$CONFIGS/default.json" "${TINY[@]}" --steps 2 --tokenizer tok --data 'shard_*.bin'
grep -aq -F "[train] sample (temperature 0.8, prompt = first 16 tokens of the validation split):" shards.out ||
  fail "no decoded sample from token shards: $(grep -a -A2 'sample' shards.out)"
must_run 1 shards_no_tok --config "$CONFIGS/default.json" "${TINY[@]}" --steps 2 --data 'shard_*.bin'
grep -aq "no text sample: shard_\*.bin holds token ids, not bytes (--tokenizer decodes them)" shards_no_tok.out ||
  fail "no hint without --tokenizer: $(grep -a 'sample' shards_no_tok.out)"

write_config small.json "$CONFIGS/default.json" 'c["model"]["vocab_size"] = 256'
if run_train 1 small --config small.json "${TINY[@]}" --steps 2 --tokenizer tok; then fail "vocab_size 256 < 260 was accepted"; fi
grep -q "^train: error: --tokenizer tok has 260 tokens but model.vocab_size is 256: the model needs at least the tokenizer's vocab size" \
  small.err || fail "vocab size error: $(cat small.err)"
if run_train 1 nope --config "$CONFIGS/default.json" "${TINY[@]}" --steps 2 --tokenizer nope; then fail "--tokenizer nope accepted"; fi
grep -q "^train: error: tokenizer nope does not exist" nope.err || fail "missing tokenizer error: $(cat nope.err)"
echo "PASS"
