#!/usr/bin/env python3
"""The Hugging Face side of bench_tokenizer: encode the same documents with the `tokenizers`
library (Rust), one thread, and print "MBps CHECKSUM NTOKENS". Needs `pip install tokenizers`
(not a Debian package); prints "unavailable" without it.

usage: bench_tokenizer_hf.py TOKENIZER_JSON CORPUS_FILE REPEATS"""
import os
import sys
import time

os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
try:
    from tokenizers import Tokenizer
except ImportError:
    print("unavailable")
    sys.exit(0)

tok = Tokenizer.from_file(sys.argv[1])
docs = open(sys.argv[2], encoding="utf-8").read().split("\x1e")
repeats = int(sys.argv[3])
nbytes = sum(len(d.encode("utf-8")) for d in docs)
# one call per document, and one encode_batch call (no per-call Python overhead; one
# thread through RAYON_RS_NUM_CPUS): HF is credited with the faster of the two
best = None
for _ in range(repeats):
    t0 = time.perf_counter()
    encs = [tok.encode(d, add_special_tokens=False).ids for d in docs]
    dt = time.perf_counter() - t0
    best = dt if best is None else min(best, dt)
    t0 = time.perf_counter()
    batch = tok.encode_batch(docs, add_special_tokens=False)
    dt = time.perf_counter() - t0
    best = min(best, dt)
    assert [e.ids for e in batch] == encs
checksum, n = 0, 0
for ids in encs:
    for i in ids:
        checksum = (checksum * 1000003 + i + 1) % (1 << 61)
        n += 1
print("%.3f %d %d" % (nbytes / best / 1e6, checksum, n))
