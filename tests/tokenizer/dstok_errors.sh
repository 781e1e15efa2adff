#!/bin/bash
# dstok's errors: a bad command line is one "dstok: error: ... (see dstok --help)" line and
# exit 2; a bad tokenizer, input or shard is one "dstok: error: ..." line naming the file (and
# the JSON key) and exit 1.
source "$(dirname "$0")/dstok_lib.sh" errors
echo "hello" >"$T/in.txt"

ENC=(encode --tokenizer "$T/gpt2" --input "$T/in.txt" --output "$T/o")

expect 2 "dstok: error: A subcommand is required (see dstok --help)"
expect 2 "dstok: error: --tokenizer is required (see dstok --help)" encode --input "$T/in.txt" --output "$T/o"
expect 2 "dstok: error: --threads: Value 0 not in range 1 to 1024 (see dstok --help)" "${ENC[@]}" --threads 0
expect 2 "dstok: error: --shard_tokens: Value 0 not in range 1 to 2147483647 (see dstok --help)" "${ENC[@]}" --shard_tokens 0
expect 2 "dstok: error: --threads: Value many not in range" "${ENC[@]}" --threads many
expect 2 "dstok: error: The following argument was not expected: --bogus (see dstok --help)" "${ENC[@]}" --bogus

# A bad DS_* value stops it first, as every tool (the tokenizer named does not exist).
DS_LOG_LEVEL=loud expect 1 "dstok: error: environment variable DS_LOG_LEVEL='loud': expected one of debug|info|warn|error" \
  encode --tokenizer "$T/nope" --input "$T/in.txt" --output "$T/o"
expect 1 "dstok: error: tokenizer $T/nope does not exist (give a directory with vocab.json and merges.txt, or a tokenizer.json)" \
  encode --tokenizer "$T/nope" --input "$T/in.txt" --output "$T/o"
mkdir "$T/half" && cp "$T/gpt2/vocab.json" "$T/half/"
expect 1 "dstok: error: tokenizer directory $T/half has no merges.txt" encode --tokenizer "$T/half" --input "$T/in.txt" --output "$T/o"
expect 1 "dstok: error: cannot open --input $T/none.txt: No such file or directory" encode --tokenizer "$T/gpt2" --input "$T/none.txt" --output "$T/o"
expect 1 "dstok: error: --output $T/no/o: directory $T/no does not exist" encode --tokenizer "$T/gpt2" --input "$T/in.txt" --output "$T/no/o"
: >"$T/empty.txt"
expect 1 "dstok: error: --input $T/empty.txt: nothing to encode (empty input)" encode --tokenizer "$T/gpt2" --input "$T/empty.txt" --output "$T/o"

# tokenizer.json variants this tokenizer does not implement: the file, line:column and key.
edit() {  # edit OUT 'python statement editing dict t'
  "$PY" - "$T/tokenizer.json" "$1" "$2" <<'PYEOF'
import json, sys
t = json.load(open(sys.argv[1], encoding="utf-8"))
exec(sys.argv[3])
json.dump(t, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False, indent=1)
PYEOF
}
edit "$T/wp.json" 't["model"]["type"] = "WordPiece"'
expect 1 "$T/wp.json:" encode --tokenizer "$T/wp.json" --input "$T/in.txt" --output "$T/o"
grep -qE "wp.json:[0-9]+:[0-9]+: key \"model.type\" is \"WordPiece\": only \"BPE\" models are supported" "$T/err" ||
  fail "model.type: $(cat "$T/err")"
edit "$T/ms.json" 't["pre_tokenizer"] = {"type": "Metaspace", "replacement": "_"}'
expect 1 "key \"pre_tokenizer.type\" is \"Metaspace\": only \"ByteLevel\" (GPT-2's pattern) is supported" \
  encode --tokenizer "$T/ms.json" --input "$T/in.txt" --output "$T/o"
edit "$T/noeot.json" 't["added_tokens"] = []; del t["model"]["vocab"]["<|endoftext|>"]'
expect 1 "dstok: error: --eot: tokenizer $T/noeot.json has no <|endoftext|> token" \
  encode --tokenizer "$T/noeot.json" --input "$T/in.txt" --output "$T/o" --eot

# Shards: not a shard, a short one, and ids the tokenizer does not have.
expect 1 "dstok: error: --input $T/in.txt is not an llm.c token shard (no magic 20240520 or 20240801 at byte 0); for a raw token file give --data_dtype uint16 or uint32" \
  decode --tokenizer "$T/gpt2" --input "$T/in.txt"
expect 2 "dstok: error: --data_dtype: int8 not in {uint16,uint32}" decode --tokenizer "$T/gpt2" --input "$T/in.txt" --data_dtype int8
"$DSTOK" "${ENC[@]}" >/dev/null
head -c 1025 "$T/o_000000.bin" >"$T/cut.bin"
expect 1 "dstok: error: token file '$T/cut.bin': truncated: the header's token count 5 (byte offset 8) needs 1034 bytes, the file ends at byte offset 1025" \
  decode --tokenizer "$T/gpt2" --input "$T/cut.bin"
"$DSTOK" encode --tokenizer "$T/tokenizer.json" --input "$T/in.txt" --output "$T/e" --eot >/dev/null
expect 1 "dstok: error: --input $T/e_000000.bin: token 556 at position 0 is not in the vocabulary of $T/noeot.json (vocab size 556)" \
  decode --tokenizer "$T/noeot.json" --input "$T/e_000000.bin"
echo "PASS"
