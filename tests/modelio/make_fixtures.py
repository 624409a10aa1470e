#!/usr/bin/env python3
"""Makes the model-IO fixtures under tests/modelio/data with Hugging Face's own libraries, so
the C readers are checked against the reference implementations. CI does not run this: the
outputs are committed. Needs torch, safetensors and tokenizers, e.g.

    /usr/bin/python3 -m venv --system-site-packages /tmp/venv      # sees Debian's python3-torch
    /tmp/venv/bin/pip install safetensors tokenizers
    /tmp/venv/bin/python tests/modelio/make_fixtures.py
    /tmp/venv/bin/python tests/modelio/make_fixtures.py sentencepiece   # those alone (tokenizers only)
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")


def safetensors_fixture():
    import torch
    from safetensors.torch import save_file
    # arange(6) * 0.5 - 1 for the float dtypes, arange(6) - 2 for the signed integers,
    # arange(6) for u8, and alternating False/True for bool (test_safetensors.c checks these)
    f = torch.arange(6, dtype=torch.float64).reshape(2, 3) * 0.5 - 1
    i = torch.arange(6, dtype=torch.int64).reshape(2, 3) - 2
    tensors = {
        "f32": f.float(), "bf16": f.bfloat16(), "f16": f.half(), "f64": f,
        "i64": i, "i32": i.int(), "i8": i.to(torch.int8),
        "u8": torch.arange(6, dtype=torch.uint8).reshape(2, 3),
        "bool": (torch.arange(6).reshape(2, 3) % 2).bool(),
    }
    path = os.path.join(DATA, "hf_written.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)


# ---- tokenizers --------------------------------------------------------------------------

GPT2_RE = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_RE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
             r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_RE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
            r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def training_text():
    """A deterministic mixed corpus: prose, contractions, code, numbers, arithmetic, accents,
    CJK, emoji, whitespace runs."""
    import random
    rng = random.Random(7)
    prose = ("The quick brown fox jumps over the lazy dog. I'm sure you're right, they'll see; we'd "
             "rather it's done. Don't stop believing! She said: \"it isn't over\". Café, naïve, "
             "résumé, façade, jalapeño, Ångström, Straße. 日本語のテキストと中文文本。 Emoji 😀👍🏽 "
             "and 👨‍👩‍👧 families. Numbers 3.14159, 2,000,000 and 1234567890. ")
    code = ("def add(a, b):\n    return a + b\n\nfor i in range(10):\n\tprint(i)  # comment\n"
            "if (x != y && z >= 0) { return -1; }\n")
    lines = [prose, code]
    for _ in range(400):
        a, b = rng.randint(0, 99999), rng.randint(0, 99999)
        lines.append(f"{a}+{b}={a + b}\n")
    words = prose.split() + code.split()
    for _ in range(300):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + rng.choice([" ", "\n", "  \n", "\t"]))
    return lines * 3


TRICKY = [
    "", "x", "Hello world", "  leading spaces", "trailing   ", "tabs\tand\nnewlines\r\n\r\n",
    "I'm, you're, they'll, we'd, she's, IT'S, I'M, Y'ALL", "don't stop", "12345678901234567890",
    "3.14159 and 2,000,000", "café naïve résumé", "cafe\u0301 decomposed", "日本語のテキスト",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧", "<|endoftext|>hello<|endoftext|>", "a <|im_start|> b <|im_end|>",
    "\u00a0non-breaking\u00a0space", "\u0085nel\u0085", "\u3000ideographic space", "mixed123abc456",
    "    \n\n    ", "$$$!!!???", "line1\nline2\n\nline4", "ＦＵＬＬＷＩＤＴＨ", "ﬁ ligature", "a\u2028b",
    "<|begin_of_text|>Hi<|eot_id|>", "x<|eot_id|>y", "<special>word", "the<special> x <special>y",
    " [MASK] and [MASK]x and x[MASK] ", "  <|endoftext|>  ", "Ωmega ΣΙΓΜΑ σίγμα", "\x00nul\x01ctl\x7f",
    "a" * 300, " " * 50 + "z", "9" * 40,
]


def random_strings(n, seed):
    import random
    rng = random.Random(seed)
    alphabet = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 3 +
                list(" \t\n\r.,;:'\"!?-_()[]{}<>/\\|@#$%^&*+=~`") * 2 +
                list("éèêëàâäôöûüçñßÆØÅæøåΩΣσδ日本語中文한국어😀👍🏽\u00a0\u3000\u0085\u2028\u200d\u0301") +
                ["'s", "'t", "'re", "'LL", "<|endoftext|>", "<|im_start|>", "<|eot_id|>", "[MASK]", "<special>", "   ", "\n\n"])
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def train(pre_tokenizer, specials, normalizer=None, vocab_size=1200, ignore_merges=False):
    from tokenizers import Tokenizer, decoders, models, trainers
    from tokenizers import pre_tokenizers as pt
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pt.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(training_text(), trainer=trainer)
    return tok


def record(tok, name, strings):
    import json
    tok.save(os.path.join(DATA, f"tok_{name}.json"))
    out = []
    for s in strings:
        e = tok.encode(s, add_special_tokens=False).ids
        e_sp = tok.encode(s, add_special_tokens=True).ids
        tok.encode_special_tokens = True
        e_plain = tok.encode(s, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        out.append({"text": s, "ids": e, "ids_add_special": e_sp, "ids_plain_special": e_plain,
                    "decoded": tok.decode(e, skip_special_tokens=False),
                    "decoded_skip": tok.decode(e, skip_special_tokens=True)})
    with open(os.path.join(DATA, f"tok_{name}.expected.jsonl"), "w", encoding="utf-8") as f:
        for o in out:
            f.write(json.dumps(o, ensure_ascii=False) + "\n")


def tokenizer_fixtures():
    from tokenizers import AddedToken, Regex, normalizers, processors
    from tokenizers import pre_tokenizers as pt
    strings = TRICKY + random_strings(300, 11)

    gpt2 = train(pt.ByteLevel(add_prefix_space=False, use_regex=True), ["<|endoftext|>"])
    gpt2.post_processor = processors.ByteLevel(trim_offsets=False)
    record(gpt2, "gpt2", strings)

    llama3 = train(pt.Sequence([pt.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
                                pt.ByteLevel(add_prefix_space=False, use_regex=False)]),
                   ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], ignore_merges=True)
    llama3.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", llama3.token_to_id("<|begin_of_text|>"))])
    record(llama3, "llama3", strings)

    qwen2 = train(pt.Sequence([pt.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
                               pt.ByteLevel(add_prefix_space=False, use_regex=False)]),
                  ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], normalizer=normalizers.NFC())
    record(qwen2, "qwen2", strings)

    # the remaining features on one tokenizer: add_prefix_space, Digits, the other Split
    # behaviours, NFKC, added tokens with lstrip / rstrip / single_word / normalized, and a
    # template that appends as well as prepends
    feat = train(pt.Sequence([pt.Digits(individual_digits=True),
                              pt.Split(Regex(r"[,;]"), behavior="merged_with_previous"),
                              pt.Split("--", behavior="removed"),
                              pt.Split(Regex(r"[.!?]+"), behavior="merged_with_next"),
                              pt.Split(Regex(r"[()]"), behavior="contiguous"),
                              pt.Split(Regex(r"\p{Lu}"), behavior="isolated", invert=True),
                              pt.ByteLevel(add_prefix_space=True, use_regex=True)]),
                 ["<|endoftext|>"], normalizer=normalizers.Sequence([normalizers.NFKC()]))
    feat.add_special_tokens([AddedToken("[MASK]", lstrip=True, rstrip=True, special=True),
                             AddedToken("<special>", single_word=True, special=True)])
    feat.add_tokens([AddedToken("Straße", normalized=True), AddedToken("ﬁ", normalized=True),
                     AddedToken(" x ", normalized=False)])
    feat.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A [MASK]", pair="$A $B",
        special_tokens=[("<|endoftext|>", feat.token_to_id("<|endoftext|>")), ("[MASK]", feat.token_to_id("[MASK]"))])
    record(feat, "features", strings + ["Straße strasse", "ﬁne ﬁ", "a -- b--c", "(((x))) ((y)", "ABC DeF gHI",
                                         "end. Next! Why?? ok,then;done", "[MASK]", " x x  x "])


def sp_train(normalizer, pre_tokenizer, decoder, specials, template, vocab_size=1000):
    """A SentencePiece-style BPE (Llama 2, Mistral, Gemma): no byte-level mapping, words made
    of characters, <0xXX> tokens for the bytes of characters the vocabulary lacks
    (byte_fallback), unknowns fused. The alphabet is cut to the frequent characters so that
    byte fallback happens; the <0xXX> tokens live in the vocabulary, not among the added
    tokens, as in the real files."""
    import json
    from tokenizers import Tokenizer, models, processors, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoder
    byte_tokens = ["<0x%02X>" % b for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials + byte_tokens, limit_alphabet=70,
                                  show_progress=False)
    tok.train_from_iterator(training_text(), trainer=trainer)
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [a for a in spec["added_tokens"] if a["content"] not in byte_tokens]
    tok = Tokenizer.from_str(json.dumps(spec))
    bos = template.split()[0]
    tok.post_processor = processors.TemplateProcessing(single=template, pair=template + " $B",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def sp_fixtures():
    from tokenizers import AddedToken, decoders, normalizers
    from tokenizers import pre_tokenizers as pt
    strings = TRICKY + random_strings(300, 11) + ["<s>Hi</s>", "a <s> b", " <s>", "한국어 텍스트", "\u2581already", "x\u2581 y"]
    sp_decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    # Llama 2 / Mistral v0.1: Prepend + Replace normalizer, no pre-tokenizer
    llama2 = sp_train(normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]), None,
                      sp_decoder, ["<unk>", "<s>", "</s>"], "<s> $A")
    llama2.add_tokens([AddedToken("<extra>", normalized=True), AddedToken("[raw]", normalized=False)])
    record(llama2, "llama2", strings + ["<extra> and<extra>", "[raw] x[raw]"])
    # Gemma: Replace only (no prefix), no Strip
    gemma = sp_train(normalizers.Replace(" ", "\u2581"), None,
                     decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]),
                     ["<pad>", "<eos>", "<bos>", "<unk>"], "<bos> $A")
    record(gemma, "gemma", strings)
    # Llama 2 / Mistral converted with legacy=False: a Metaspace pre-tokenizer prepending to
    # the first piece only, and the Metaspace decoder
    meta = sp_train(None, pt.Metaspace(replacement="\u2581", prepend_scheme="first", split=False),
                    decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False), ["<unk>", "<s>", "</s>"], "<s> $A")
    record(meta, "metaspace", strings)
    # Metaspace splitting into words, prepending to every piece
    metasplit = sp_train(None, pt.Metaspace(replacement="\u2581", prepend_scheme="always", split=True), sp_decoder,
                         ["<unk>", "<s>", "</s>"], "<s> $A")
    record(metasplit, "metaspace_split", strings)


def bytes_fixture():
    """The byte-level tokenizer as fuseflow writes it must load in Hugging Face's library and
    encode every string to its bytes."""
    from tokenizers import Tokenizer
    path = os.path.join(DATA, "tok_bytes.json")
    if not os.path.exists(path):
        return
    tok = Tokenizer.from_file(path)
    for s in TRICKY + random_strings(100, 5):
        ids = tok.encode(s, add_special_tokens=False).ids
        plain = s.replace("<|bos|>", "").replace("<|eos|>", "").replace("<|pad|>", "")
        assert ids == list(s.encode("utf-8")), (s, ids)
        assert tok.decode(ids) == s
    assert tok.encode("a<|eos|>", add_special_tokens=False).ids == [97, 257]
    print("tok_bytes.json: Hugging Face encodes every test string to its bytes")


if __name__ == "__main__":
    os.makedirs(DATA, exist_ok=True)
    if sys.argv[1:] == ["sentencepiece"]:
        sp_fixtures()
        sys.exit(0)
    safetensors_fixture()
    tokenizer_fixtures()
    sp_fixtures()
    bytes_fixture()
