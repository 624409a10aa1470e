#!/usr/bin/env python3
"""fuseflow's tokenizers against Hugging Face's `tokenizers`, live, on random input: for every
committed tokenizer fixture, N random strings (ASCII, contractions, spaces of every kind,
U+180E, NUL and control bytes, marks, CJK, emoji, and the letters and digits of Unicode 15/16)
are encoded by `fuseflow tokenize --jsonl` and by the library, and N random id lists (byte
tokens, specials, anything) are decoded by both, with and without special tokens.

usage: compare_hf.py FUSEFLOW_BIN SOURCE_DIR N     exit 0 when all equal, 1 otherwise,
77 when `tokenizers` (or `unicodedata2`) is not importable."""
import json
import random
import subprocess
import sys
import unicodedata

try:
    from tokenizers import Tokenizer
    import unicodedata2
except ImportError as e:
    print(f"SKIP: {e} (scripts/deps.sh --bench, or FF_PYTHON with tokenizers and unicodedata2)")
    sys.exit(77)

FF, SRC, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
NAMES = ["gpt2", "llama3", "qwen2", "features", "llama2", "gemma", "metaspace", "metaspace_split"]
# features' Split regexes (\p{Lu}, ...) run on the system's PCRE2, whose Unicode tables are
# older (docs/model-files.md): its texts leave out what changed since
PCRE2 = {"features"}
rng = random.Random(16)
new = [chr(c) for c in range(0x10000, 0x33000)
       if unicodedata2.category(chr(c))[0] in "LN" and unicodedata2.category(chr(c)) != unicodedata.category(chr(c))]
pool = list("abcXYZ  \t\n\r'sStTdDmMlLrReEvV012345.,;!?()_-") + \
    ["ſ", "\u180e", "\u00a0", "\u2003", "\u3000", "\u0085", "\u200b", "\u2028", "\u1c89", "é", "日", "한", "😀", "١", "Ⅻ", "²",
     "\u0301", "\x00", "\x0b", "\x1c", "▁", "<s>", "</s>", "<|endoftext|>", "<|im_start|>", "[MASK]", "<special>"]
texts = ["".join(rng.choice(new) if rng.random() < 0.2 else rng.choice(pool) for _ in range(rng.randint(0, 30))) for _ in range(N)]
changed = set(new) | {"\u180e", "\u1c89"}
old_texts = ["".join(c for c in t if c not in changed) for t in texts]


def run(path, lines, extra):
    out = subprocess.run([FF, "tokenize", "--tokenizer", path, "--jsonl"] + extra, input="".join(lines).encode(), capture_output=True)
    if out.returncode:
        sys.exit(f"fuseflow tokenize failed: {out.stderr.decode()}")
    return [json.loads(l) for l in out.stdout.decode().splitlines()]


bad = 0
for name in NAMES:
    path = f"{SRC}/tests/modelio/data/tok_{name}.json"
    tok = Tokenizer.from_file(path)
    ts = old_texts if name in PCRE2 else texts
    got = run(path, [json.dumps({"text": t}) + "\n" for t in ts], [])
    n_enc = sum(tok.encode(t, add_special_tokens=False).ids != g["ids"] for t, g in zip(ts, got))
    V = tok.get_vocab_size()
    seqs = [[rng.choice([rng.randrange(V), rng.randrange(0, 40), rng.randrange(0xC3, 0xF8)]) for _ in range(rng.randint(0, 12))] for _ in range(N)]
    n_dec = 0
    for skip in (False, True):
        got = run(path, [json.dumps({"ids": s}) + "\n" for s in seqs], ["--decode"] + (["--skip-special"] if skip else []))
        n_dec += sum(tok.decode(s, skip_special_tokens=skip) != g["text"] for s, g in zip(seqs, got))
    print(f"{name}: {N} texts{' (no Unicode 15/16 letters, no U+180E: PCRE2)' if name in PCRE2 else ''}, {n_enc} encode differently; {2 * N} id lists, {n_dec} decode differently")
    bad += n_enc + n_dec
sys.exit(1 if bad else 0)
