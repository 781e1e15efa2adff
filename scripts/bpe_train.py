#!/usr/bin/env python3
"""Learns a small byte-level BPE vocabulary from text files and writes it in GPT-2's form
(vocab.json + merges.txt), which dstok and train --tokenizer read.

usage: bpe_train.py --input FILE [--input FILE ...] --merges N --output DIR

The vocabulary is GPT-2's 256 byte tokens (in GPT-2's order), then one token per learned merge,
then <|endoftext|>: at most 256 + N + 1 ids. Merges are learned as GPT-2's were: the text is cut into
pieces with GPT-2's pattern, and the most frequent adjacent pair inside a piece is merged, N
times (ties: the smaller pair, so the result is the same on every run).

Plain Python (no packages). Python's `re` has no \\p{L}: letters are [^\\W\\d_] and numbers \\d,
close to what dstok uses. A piece cut slightly differently only makes a merge less useful,
never wrong: any merge list whose tokens are in the vocabulary encodes every text.
"""
import argparse
import json
import os
import re
import sys

PAT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")
EOT = "<|endoftext|>"


def bytes_to_unicode():
    """GPT-2's printable spelling of each byte; returns (bytes in GPT-2's order, byte -> char)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, {b: chr(c) for b, c in zip(bs, cs)}


def learn(counts, n_merges):
    """counts: {tuple of symbols: occurrences}. Returns the merge list [(a, b), ...]."""
    words = [list(w) for w in counts]
    freq = list(counts.values())
    pairs, where = {}, {}
    for i, w in enumerate(words):
        for p in zip(w, w[1:]):
            pairs[p] = pairs.get(p, 0) + freq[i]
            where.setdefault(p, set()).add(i)
    merges = []
    while len(merges) < n_merges and pairs:
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break  # nothing repeats any more
        merges.append(best)
        joined = best[0] + best[1]
        for i in where.pop(best, ()):
            w, f = words[i], freq[i]
            for p in zip(w, w[1:]):
                pairs[p] -= f
                if pairs[p] == 0:
                    del pairs[p]
            out, k = [], 0
            while k < len(w):
                if k + 1 < len(w) and (w[k], w[k + 1]) == best:
                    out.append(joined)
                    k += 2
                else:
                    out.append(w[k])
                    k += 1
            words[i] = out
            for p in zip(out, out[1:]):
                pairs[p] = pairs.get(p, 0) + f
                where.setdefault(p, set()).add(i)
        pairs.pop(best, None)
    return merges


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", action="append", required=True, help="UTF-8 text file (repeatable)")
    ap.add_argument("--merges", type=int, required=True, help="merges to learn (vocab size = 257 + merges)")
    ap.add_argument("--output", required=True, help="directory for vocab.json and merges.txt (created)")
    a = ap.parse_args()
    if a.merges < 0:
        sys.exit(f"bpe_train.py: error: --merges must be >= 0, got {a.merges}")
    order, b2u = bytes_to_unicode()
    counts = {}
    for path in a.input:
        try:
            text = open(path, "rb").read().decode("utf-8", errors="replace")
        except OSError as e:
            sys.exit(f"bpe_train.py: error: --input {path}: {e.strerror}")
        for part in text.split(EOT):
            for piece in PAT.findall(part):
                w = tuple(b2u[b] for b in piece.encode("utf-8"))
                counts[w] = counts.get(w, 0) + 1
    merges = learn(counts, a.merges)
    vocab = {b2u[b]: i for i, b in enumerate(order)}
    for x, y in merges:
        vocab.setdefault(x + y, len(vocab))  # two merges may spell one token ("a"+"bc", "ab"+"c")
    vocab[EOT] = len(vocab)
    os.makedirs(a.output, exist_ok=True)
    with open(os.path.join(a.output, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(a.output, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{x} {y}\n" for x, y in merges))
    print(f"bpe_train.py: {len(merges)} merges, vocab size {len(vocab)} -> {a.output}/vocab.json, merges.txt")


if __name__ == "__main__":
    main()
