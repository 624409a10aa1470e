#!/usr/bin/env python3
"""Makes tests/modelio/data/tok_unicode16.expected.jsonl with Hugging Face's `tokenizers`
(Unicode 16 classes): for the letters and digits added in Unicode 15 and 16 and for U+180E,
the pre-tokenizer's pieces and the ids of the GPT-2, Llama 3 and Qwen2 fixtures. CI does not
run this: the output is committed. Needs only `pip install tokenizers`.
"""
import json
import os

from tokenizers import Regex, Tokenizer, pre_tokenizers as pt

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")

# one letter (or digit) of each class the issue names, with the Unicode version that added it
CLASSES = [
    ("CJK Extension H (15.0)", "\U00031350\U00031351"),
    ("CJK Extension I (15.1)", "\U0002EBF0\U0002EBF1"),
    ("Kawi (15.0)", "\U00011F04\U00011F05"),
    ("Kawi digits (15.0)", "\U00011F50\U00011F51\U00011F52\U00011F53"),
    ("Garay (16.0)", "\U00010D50\U00010D70"),
    ("Garay digits (16.0)", "\U00010D40\U00010D41\U00010D42\U00010D43"),
    ("Kirat Rai (16.0)", "\U00016D43\U00016D44"),
    ("Kirat Rai digits (16.0)", "\U00016D70\U00016D71\U00016D72\U00016D73"),
    ("Todhri (16.0)", "\U000105C0\U000105C1"),
    ("U+1C89 CYRILLIC CAPITAL LETTER TJE (16.0)", "\u1C89\u1C8A"),
]


def cases():
    for cls, x in CLASSES:
        for t in (x + "'s", x + "'S", "a " + x + "'ll", " " + x, "(" + x + ")", x + "123" + x, x[0] + "\n\n" + x):
            yield cls, t
    for t in ("\u180e", "a\u180eb", "a \u180eb", " \u180e x", "x\u180e's", "\u180e\u180e\n", "a  \u180e"):
        yield "U+180E MONGOLIAN VOWEL SEPARATOR (not White_Space since 6.3)", t


def main():
    out = []
    for name in ("gpt2", "llama3", "qwen2"):
        path = os.path.join(DATA, f"tok_{name}.json")
        tok = Tokenizer.from_file(path)
        spec = json.load(open(path))["pre_tokenizer"]
        if spec["type"] == "ByteLevel":
            split = pt.ByteLevel(add_prefix_space=False, use_regex=True)
        else:
            split = pt.Split(Regex(spec["pretokenizers"][0]["pattern"]["Regex"]), behavior="isolated")
        for cls, t in cases():
            pieces = [p for p, _ in split.pre_tokenize_str(t)]
            if spec["type"] == "ByteLevel":  # pieces come back byte-mapped: map them back
                dec = {v: k for k, v in bytes_to_unicode().items()}
                pieces = [bytes(dec[c] for c in p).decode("utf-8") for p in pieces]
            out.append({"tokenizer": name, "class": cls, "text": t, "pieces": pieces,
                        "ids": tok.encode(t, add_special_tokens=False).ids})
    with open(os.path.join(DATA, "tok_unicode16.expected.jsonl"), "w", encoding="utf-8") as f:
        for o in out:
            f.write(json.dumps(o, ensure_ascii=False) + "\n")
    print(f"{len(out)} cases")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


if __name__ == "__main__":
    main()
