#!/usr/bin/python3
"""An independent, plain reference for dstok: GPT-2's encoder.py algorithm in Python.

bytes_to_unicode and bpe() follow GPT-2's encoder.py (merge the lowest-ranked bigram, all its
occurrences left to right, until none is left); the pre-tokenizer is GPT-2's pattern written
for Python's `re` (no `regex` module here): \\p{L} is [^\\W\\d_], \\p{N} is \\d, so the test
texts stay within letters and decimal digits that both agree on.

usage: bpe_reference.py OUTDIR
  Trains a small merge list on a built-in corpus, writes OUTDIR/gpt2/{vocab.json,merges.txt}
  and OUTDIR/tokenizer.json (the same tokenizer), OUTDIR/big_vocab.json (a tokenizer.json whose
  ids pass 65535), the test texts OUTDIR/text_<i>.txt and OUTDIR/big.txt (a longer text with
  every kind of line end), OUTDIR/binary.bin (random bytes, mostly invalid UTF-8) and the
  expected ids OUTDIR/expected.json ("ids": one list per text_<i>, "big": big.txt's).
"""
import json
import os
import random
import re
import sys

PAT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")
EOT = "<|endoftext|>"


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, dict(zip(bs, [chr(c) for c in cs]))


def spell(text, b2u):
    return "".join(b2u[b] for b in text.encode("utf-8"))


def bpe(word, ranks):
    word = list(word)
    while len(word) > 1:
        pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        out, i = [], 0
        while i < len(word):
            if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                out.append(word[i] + word[i + 1])
                i += 2
            else:
                out.append(word[i])
                i += 1
        word = out
    return word


def encode(text, vocab, ranks, b2u, memo):
    ids = []
    parts = text.split(EOT)
    for k, part in enumerate(parts):
        if k > 0:
            ids.append(vocab[EOT])
        for piece in PAT.findall(part):
            if piece not in memo:
                memo[piece] = [vocab[t] for t in bpe(spell(piece, b2u), ranks)]
            ids.extend(memo[piece])
    return ids


CORPUS = """The quick brown fox jumps over the lazy dog. The dog didn't care; it's the fox's problem.
We're here, they've gone, I'm tired, you'll see, he'd know. Numbers: 12345 and 2026 and 3.14159!
Ελληνικά γράμματα και ελληνικές λέξεις. Русский текст и ещё немного русских слов.
Café naïve résumé façade — déjà vu. 中文文本和更多的中文字符。日本語のテキストです。
    indented    text   with     many    spaces		and	tabs
def main(): return foo_bar(x) + baz_qux[y]  # code-like text
the the the then there these those other another mother brother

trailing spaces   \n\n\nblank lines above  \n \n
"""

TEXTS = [
    "Hello world! The fox's den isn't far; we're sure they'll see it.",
    "don't DON'T it's IT'S we've you'd I'm y'all 'tis '''",
    "a  b   c\n\n\nd \n e\t\tf   \n   g    ",
    "   leading and trailing   ",
    "\n\n",
    "Ελληνικά και Русский текст, Café déjà vu, 中文文本。日本語のテキスト",
    "prices: 1234567 3.14 $100 ５０ x_y__z -- ... !!! ???",
    "one<|endoftext|>two <|endoftext|> three<|endoftext|><|endoftext|>",
    "emoji 🙂🙂 and ✓ marks ©®",
    "line one\nline two\nline three\n\nafter blank\n  indented\nend",
]


def main():
    out = sys.argv[1]
    bs, b2u = bytes_to_unicode()
    # Byte tokens in GPT-2's order (so ids differ from byte values), then the merges, then EOT.
    vocab = {b2u[b]: i for i, b in enumerate(bs)}
    words = {}
    for piece in PAT.findall(CORPUS):
        w = tuple(spell(piece, b2u))
        words[w] = words.get(w, 0) + 1
    merges = []
    for _ in range(300):
        counts = {}
        for w, c in words.items():
            for i in range(len(w) - 1):
                counts[(w[i], w[i + 1])] = counts.get((w[i], w[i + 1]), 0) + c
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        vocab[best[0] + best[1]] = len(vocab)
        new_words = {}
        for w, c in words.items():
            new_words[tuple(bpe(w, {best: 0}))] = new_words.get(tuple(bpe(w, {best: 0})), 0) + c
        words = new_words
    vocab[EOT] = len(vocab)
    ranks = {m: i for i, m in enumerate(merges)}

    os.makedirs(os.path.join(out, "gpt2"), exist_ok=True)
    with open(os.path.join(out, "gpt2", "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out, "gpt2", "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    tok = {
        "version": "1.0",
        "added_tokens": [{"id": vocab[EOT], "content": EOT, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        # Half the merges in the older "a b" form, half in the newer ["a", "b"] form.
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab,
                  "merges": [f"{a} {b}" if i % 2 else [a, b] for i, (a, b) in enumerate(merges)]},
    }
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    # The same tokenizer with filler tokens up to id 70000 (EOT there): shards need uint32.
    big = dict(vocab)
    del big[EOT]
    for i in range(len(big), 70000):
        big[spell(f"<filler {i}>", b2u)] = i
    big[EOT] = 70000
    tok["model"]["vocab"] = big
    tok["added_tokens"][0]["id"] = 70000
    with open(os.path.join(out, "big_vocab.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)

    memo = {}
    expected = []
    for i, text in enumerate(TEXTS):
        with open(os.path.join(out, f"text_{i}.txt"), "wb") as f:
            f.write(text.encode("utf-8"))
        expected.append(encode(text, vocab, ranks, b2u, memo))
    # Lines of every shape (blank runs, trailing spaces, leading spaces, specials, CJK line
    # ends), so the parallel cuts land on all of them.
    rng = random.Random(7)
    lines = CORPUS.split("\n") + TEXTS + ["", "", "   ", "x ", " y", "\t", "。", "<|endoftext|>", "end<|endof"]
    big_text = "\n".join(rng.choice(lines) for _ in range(6000))
    with open(os.path.join(out, "big.txt"), "wb") as f:
        f.write(big_text.encode("utf-8"))
    with open(os.path.join(out, "binary.bin"), "wb") as f:
        f.write(bytes(rng.randrange(256) for _ in range(20000)))
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"vocab_size": len(vocab), "merges": len(merges), "ids": expected,
                   "big": encode(big_text, vocab, ranks, b2u, memo)}, f)


if __name__ == "__main__":
    main()
