#!/usr/bin/env python3
"""Model folders written by Hugging Face transformers (save_pretrained) with the log-probs
transformers computes for them, so tests/cli/test_logprobs.sh checks the whole path (HF
config.json, safetensors in F32 / BF16 / shards, tokenizer.json, the model) against the
reference. CI does not run this; the outputs are committed. Needs torch, transformers,
tokenizers (see tests/modelio/make_fixtures.py for a venv recipe).

    /tmp/venv/bin/python tests/cli/make_fixtures.py
"""
import json
import os
import shutil

import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
TOKS = os.path.join(HERE, "..", "modelio", "data")

TEXTS = ["12+34=46", "Hello, world! I'm here.", "  spaces\tand\nnewlines  ", "café 日本 😀", "7"]


def tokenizer(name, **roles):
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(TOKS, f"tok_{name}.json"), **roles)
    return tok


def build(name, model, tok, dtype, shard=None, add_special=False):
    out = os.path.join(DATA, name)
    shutil.rmtree(out, ignore_errors=True)
    model = model.to(dtype)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=shard or "10GB")
    tok.save_pretrained(out)
    for f in os.listdir(out):
        os.chmod(os.path.join(out, f), 0o644)
    # HF extras fuseflow does not read
    for f in ("generation_config.json", "special_tokens_map.json"):
        p = os.path.join(out, f)
        if os.path.exists(p):
            os.remove(p)
    # the reference: fp32 compute on the stored weights
    ref = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    rng = torch.Generator().manual_seed(5)
    lines = []
    V = ref.config.vocab_size
    for n in (1, 2, 9, 33):
        ids = torch.randint(0, V, (n,), generator=rng).tolist()
        lines.append({"tokens": ids})
    for t in TEXTS:
        lines.append({"text": t})
    with open(os.path.join(DATA, f"{name}.input.jsonl"), "w") as f:
        for l in lines:
            f.write(json.dumps(l, ensure_ascii=False) + "\n")
    with open(os.path.join(DATA, f"{name}.expected.jsonl"), "w") as f:
        for l in lines:
            ids = l["tokens"] if "tokens" in l else tok(l["text"], add_special_tokens=add_special)["input_ids"]
            with torch.no_grad():
                logits = ref(torch.tensor([ids])).logits[0].float()
            lp = torch.log_softmax(logits, -1)[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
            f.write(json.dumps({"ids": ids, "logprobs": lp.tolist()}) + "\n")


def greedy(name, prompt, add_special, n_new=12):
    """transformers' greedy continuation, for test_generate.sh"""
    out = os.path.join(DATA, name)
    ref = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    tok = PreTrainedTokenizerFast.from_pretrained(out)
    ids = tok(prompt, add_special_tokens=add_special)["input_ids"]
    with torch.no_grad():
        g = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=n_new, do_sample=False,
                         eos_token_id=ref.config.eos_token_id, pad_token_id=0)[0][len(ids):].tolist()
    with open(os.path.join(DATA, f"{name}.greedy.json"), "w") as f:
        json.dump({"prompt": prompt, "add_special": add_special, "max_new_tokens": n_new, "tokens": g}, f)
        f.write("\n")


def main():
    os.makedirs(DATA, exist_ok=True)
    torch.manual_seed(0)
    # Llama, tied embeddings, GQA, llama3 rope scaling, F32, the byte tokenizer
    cfg = LlamaConfig(vocab_size=259, hidden_size=16, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      rope_theta=5000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                      bos_token_id=256, eos_token_id=257, pad_token_id=258, initializer_range=0.5,
                      rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 2.0, "original_max_position_embeddings": 16})
    tok = tokenizer("bytes", bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>")
    build("llama_f32", LlamaForCausalLM(cfg), tok, torch.float32)

    # Qwen2: q/k/v biases, untied head, BF16 weights, a Qwen2-style BPE tokenizer (NFC)
    qtok = tokenizer("qwen2", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    cfg = Qwen2Config(vocab_size=len(qtok), hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      rope_theta=1e6, tie_word_embeddings=False, initializer_range=0.5,
                      bos_token_id=None, eos_token_id=2, use_sliding_window=False)
    m = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # biases are zero at init: make them matter
        for l in m.model.layers:
            for p in (l.self_attn.q_proj.bias, l.self_attn.k_proj.bias, l.self_attn.v_proj.bias):
                p.normal_(0, 0.5)
    build("qwen2_bf16", m, qtok, torch.bfloat16)

    # Mistral without sliding window, sharded safetensors, a Llama 3 style tokenizer whose
    # template adds <|begin_of_text|>
    ltok = tokenizer("llama3", bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    cfg = MistralConfig(vocab_size=len(ltok), hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=4, head_dim=8, max_position_embeddings=64,
                        sliding_window=None, tie_word_embeddings=False, initializer_range=0.5,
                        bos_token_id=0, eos_token_id=2)
    build("mistral_sharded", MistralForCausalLM(cfg), ltok, torch.float32, shard="40KB", add_special=True)

    greedy("llama_f32", "12+34=", False)
    greedy("qwen2_bf16", "Hello, world", False)
    greedy("mistral_sharded", "I'm here", True)


if __name__ == "__main__":
    main()
