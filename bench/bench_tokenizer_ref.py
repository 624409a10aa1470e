#!/usr/bin/env python3
"""The reference side of bench_tokenizer: encode the same documents, one thread, with
  - tiktoken (OpenAI's encoder, Rust): an Encoding built from the tokenizer.json's own
    vocabulary (byte-level tokens mapped back to bytes; ranks = ids, which is BPE order for a
    trained byte-level BPE), its pre-tokenizer regex and its added tokens as specials: the
    same vocabulary on both sides, no download;
  - Hugging Face `tokenizers` (Rust), the library fuseflow's ids are checked against.
Prints one line per library: "NAME TOKENS_PER_S CHECKSUM NTOKENS", or "NAME unavailable".
Install both with `scripts/deps.sh --bench` (a venv; not Debian packages).

usage: bench_tokenizer_ref.py TOKENIZER_JSON CORPUS_FILE REPEATS"""
import json
import os
import sys
import time

os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

path, corpus, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
docs = open(corpus, encoding="utf-8").read().split("\x1e")


def checksum(all_ids):
    c, n = 0, 0
    for ids in all_ids:
        for i in ids:
            c = (c * 1000003 + i + 1) % (1 << 61)
            n += 1
    return c, n


def best_of(fn):
    """the fastest of `repeats` runs of fn() -> list of id lists"""
    best, out = None, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best, out


def report(name, runs):
    """runs: (seconds, ids) per way of calling; the library is credited with the fastest"""
    ids = runs[0][1]
    assert all(r[1] == ids for r in runs), f"{name}: the ways of calling disagree"
    c, n = checksum(ids)
    print(f"{name} {n / min(r[0] for r in runs):.0f} {c} {n}", flush=True)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tiktoken_side():
    try:
        import tiktoken
    except ImportError:
        print("tiktoken unavailable", flush=True)
        return
    spec = json.load(open(path, encoding="utf-8"))
    pre = spec["pre_tokenizer"]
    steps = pre["pretokenizers"] if pre["type"] == "Sequence" else [pre]
    pat = None
    for st in steps:
        if st["type"] == "Split":
            pat = st["pattern"]["Regex"]
        elif st["type"] == "ByteLevel" and st.get("use_regex", True):
            pat = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    dec = bytes_to_unicode()
    ranks = {bytes(dec[c] for c in tok): i for tok, i in spec["model"]["vocab"].items()}
    specials = {a["content"]: a["id"] for a in spec["added_tokens"]}
    for s in specials:
        ranks.pop(s.encode(), None)
    enc = tiktoken.Encoding("fuseflow-bench", pat_str=pat, mergeable_ranks=ranks, special_tokens=specials)
    per_doc = best_of(lambda: [enc.encode(d, allowed_special="all") for d in docs])
    batch = best_of(lambda: enc.encode_batch(docs, num_threads=1, allowed_special="all"))
    report("tiktoken", [per_doc, batch])


def hf_side():
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("hf unavailable", flush=True)
        return
    tok = Tokenizer.from_file(path)
    per_doc = best_of(lambda: [tok.encode(d, add_special_tokens=False).ids for d in docs])
    batch = best_of(lambda: [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)])
    report("hf", [per_doc, batch])


tiktoken_side()
hf_side()
