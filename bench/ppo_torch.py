#!/usr/bin/env python3
"""One PPO iteration of the bundled arithmetic setting, written plainly in PyTorch: the side
of bench/bench_ppo_engines.c and bench/bench_ppo_iter.c that fuseflow is compared with, in
the same run.

What one iteration does (the same stages and settings as the C side):
  1. generate: each of B prompts is prefilled once, its KV cache repeated for n samples, then
     all B*n sequences decode together with a KV cache (sampling at the temperature, stop at
     eos or max_new tokens); the sampled tokens' log-probs are kept as old_logprob;
  2. reward: exact match of the first number of the decoded response with the answer;
  3. ref log-probs (the reference model) and critic values over micro-batches (padded);
  4. token rewards = score on the last token - kl_coef * (old_logprob - ref_logprob);
     GAE (gamma, lam) by the usual loop over positions, advantages whitened;
  5. critic then actor: shuffled mini-batches, micro-batches with gradient accumulation,
     clipped value loss / PPO clip + dual clip, token-mean over the mini-batch, AdamW with
     gradient clipping;
  6. weight sync: the trained actor's parameters copied into the generating model.

Models are read from the fuseflow model folder (config.json + model.safetensors, Llama
architecture) with the small safetensors reader below. Prompts come as token ids from the
--prompts JSONL file the C side writes ({"ids": [...], "answer": "..."}).

Run with Debian's PyTorch: /usr/bin/python3 bench/ppo_torch.py --model DIR --prompts FILE ...
The last line is JSON: {"iter_s": median seconds per iteration, "stages": {...}, ...}.
"""
import argparse
import copy
import json
import math
import re
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- model files --------------------------------------------------------------------------

def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[base + a:base + b]
        shape = info["shape"]
        if info["dtype"] == "F32":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy())
        elif info["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            t = torch.from_numpy(u.view(np.float32).copy())
        elif info["dtype"] == "F16":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.float16).astype(np.float32))
        else:
            raise SystemExit(f"{path}: tensor {name} has dtype {info['dtype']}, not supported here")
        out[name] = t.reshape(shape)
    return out


def load_model_dir(d):
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    return cfg, load_safetensors(f"{d}/model.safetensors")


# ---- the Llama model --------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, w, eps):
        super().__init__()
        self.weight = nn.Parameter(w.clone())
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer(nn.Module):
    def __init__(self, cfg, w, i):
        super().__init__()
        p = f"model.layers.{i}."
        self.H, self.Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.D = cfg.get("head_dim") or cfg["hidden_size"] // self.H
        eps = cfg["rms_norm_eps"]
        self.ln1 = RMSNorm(w[p + "input_layernorm.weight"], eps)
        self.ln2 = RMSNorm(w[p + "post_attention_layernorm.weight"], eps)

        def lin(name):
            l = nn.Linear(w[p + name + ".weight"].shape[1], w[p + name + ".weight"].shape[0],
                          bias=(p + name + ".bias") in w)
            l.weight.data.copy_(w[p + name + ".weight"])
            if l.bias is not None:
                l.bias.data.copy_(w[p + name + ".bias"])
            return l
        self.q, self.k, self.v = lin("self_attn.q_proj"), lin("self_attn.k_proj"), lin("self_attn.v_proj")
        self.o = lin("self_attn.o_proj")
        self.gate, self.up, self.down = lin("mlp.gate_proj"), lin("mlp.up_proj"), lin("mlp.down_proj")

    def forward(self, x, cos, sin, mask, cache):
        B, L, _ = x.shape
        h = self.ln1(x)
        q = self.q(h).view(B, L, self.H, self.D).transpose(1, 2)
        k = self.k(h).view(B, L, self.Hkv, self.D).transpose(1, 2)
        v = self.v(h).view(B, L, self.Hkv, self.D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            if cache[0] is not None:
                k = torch.cat([cache[0], k], dim=2)
                v = torch.cat([cache[1], v], dim=2)
            cache[0], cache[1] = k, v
        rep = self.H // self.Hkv
        kk = k.repeat_interleave(rep, dim=1)
        vv = v.repeat_interleave(rep, dim=1)
        s = (q @ kk.transpose(-1, -2)) / math.sqrt(self.D) + mask
        a = torch.softmax(s, dim=-1) @ vv
        x = x + self.o(a.transpose(1, 2).reshape(B, L, self.H * self.D))
        h = self.ln2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """A Llama-family decoder with an LM head (tied or not) and an optional value head."""

    def __init__(self, cfg, w, value_head=False):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding.from_pretrained(w["model.embed_tokens.weight"].clone(), freeze=False)
        self.layers = nn.ModuleList(Layer(cfg, w, i) for i in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(w["model.norm.weight"], cfg["rms_norm_eps"])
        self.tied = cfg.get("tie_word_embeddings", False)
        if not self.tied:
            self.lm_head = nn.Parameter(w["lm_head.weight"].clone())
        self.score = nn.Parameter(torch.zeros(1, cfg["hidden_size"])) if value_head else None
        D = self.layers[0].D
        self.inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float32) / D))

    def forward(self, ids, pos, mask, caches=None):
        """ids, pos [B, L]; mask [B, 1, L, Lk] additive. Returns the final hidden states."""
        x = self.embed(ids)
        ang = pos[..., None].float() * self.inv_freq
        emb = torch.cat([ang, ang], dim=-1)[:, None]
        cos, sin = emb.cos(), emb.sin()
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, caches[i] if caches is not None else None)
        return self.norm(x)

    def logits(self, h):
        return h @ (self.embed.weight if self.tied else self.lm_head).t()

    def values(self, h):
        return (h @ self.score.t()).squeeze(-1)


NEG = -1e9


def pad_mask(valid_q, valid_k, causal_offset):
    """Additive mask [B, 1, Lq, Lk]: key j visible to query i when valid and j <= i + offset."""
    Lq, Lk = valid_q.shape[1], valid_k.shape[1]
    causal = torch.ones(Lq, Lk, dtype=torch.bool).tril(causal_offset)
    ok = causal[None] & valid_k[:, None, :].bool()
    m = torch.zeros(ok.shape)
    m[~ok] = NEG
    return m[:, None]


# ---- one iteration ----------------------------------------------------------------------------

def generate(model, prompts, n, temperature, max_new, eos, pad, gen):
    """Left-padded prefill of each prompt once, KV repeated n times, batched decoding."""
    B = len(prompts)
    P = max(len(p) for p in prompts)
    ids = torch.full((B, P), pad, dtype=torch.long)
    valid = torch.zeros(B, P, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p)
        valid[i, P - len(p):] = 1
    pos = (valid.cumsum(1) - 1).clamp(min=0)
    L = len(model.layers)
    caches = [[None, None] for _ in range(L)]
    with torch.no_grad():
        h = model(ids, pos, pad_mask(valid, valid, 0), caches)
        logits = model.logits(h[:, -1])
        caches = [[c[0].repeat_interleave(n, 0), c[1].repeat_interleave(n, 0)] for c in caches]
        logits = logits.repeat_interleave(n, 0)
        valid = valid.repeat_interleave(n, 0)
        next_pos = pos[:, -1].repeat_interleave(n, 0) + 1
        S = B * n
        out = torch.full((S, max_new), pad, dtype=torch.long)
        lps = torch.zeros(S, max_new)
        done = torch.zeros(S, dtype=torch.bool)
        lengths = torch.zeros(S, dtype=torch.long)
        for t in range(max_new):
            lp = torch.log_softmax(logits / temperature, dim=-1)
            tok = torch.multinomial(lp.exp(), 1, generator=gen).squeeze(1)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            out[:, t] = tok
            lps[:, t] = lp.gather(1, tok[:, None]).squeeze(1) * (~done)
            lengths += (~done).long()
            done = done | (tok == eos)
            if bool(done.all()) or t == max_new - 1:
                break
            valid = torch.cat([valid, torch.ones(S, 1, dtype=torch.long)], 1)
            h = model(tok[:, None], next_pos[:, None], pad_mask(torch.ones(S, 1), valid, valid.shape[1] - 1), caches)
            logits = model.logits(h[:, -1])
            next_pos = next_pos + 1
    R = int(lengths.max())
    return out[:, :R], lps[:, :R], lengths


def first_number(text):
    m = re.search(r"[-+]?\d[\d,]*(\.\d+)?", text)
    return m.group(0).replace(",", "").lstrip("+") if m else None


def pack_full(prompts_rep, resp, lengths, pad):
    """Prompt (left-padded) + response (right-padded): ids, pos, valid [S, P + R]."""
    S, R = resp.shape
    P = max(len(p) for p in prompts_rep)
    ids = torch.full((S, P + R), pad, dtype=torch.long)
    valid = torch.zeros(S, P + R, dtype=torch.long)
    for i, p in enumerate(prompts_rep):
        ids[i, P - len(p):P] = torch.tensor(p)
        valid[i, P - len(p):P] = 1
        ids[i, P:P + int(lengths[i])] = resp[i, :int(lengths[i])]
        valid[i, P:P + int(lengths[i])] = 1
    pos = (valid.cumsum(1) - 1).clamp(min=0)
    return ids, pos, valid, P


def response_outputs(model, ids, pos, valid, P, R, temperature, want_values):
    h = model(ids, pos, pad_mask(valid, valid, 0))
    hr = h[:, P - 1:P - 1 + R]
    if want_values:
        return model.values(hr), None
    logits = model.logits(hr) / temperature
    return torch.log_softmax(logits, dim=-1), logits


def masked_whiten(x, m):
    mean = (x * m).sum() / m.sum()
    var = ((x - mean) ** 2 * m).sum() / (m.sum() - 1)
    return (x - mean) * torch.rsqrt(var + 1e-8)


def ppo_iteration(a, actor, gen_model, critic, ref, opt_a, opt_c, prompts, answers, gen):
    st = {}
    t0 = time.perf_counter()
    resp, old_lp, lengths = generate(gen_model, prompts, a.n, a.temperature, a.max_new, a.eos, a.pad, gen)
    S, R = resp.shape
    mask = (torch.arange(R)[None] < lengths[:, None]).float()
    t1 = time.perf_counter()
    st["generate"] = t1 - t0
    prompts_rep = [p for p in prompts for _ in range(a.n)]
    answers_rep = [x for x in answers for _ in range(a.n)]
    scores = torch.zeros(S)
    for i in range(S):
        toks = [int(t) for t in resp[i, :int(lengths[i])] if int(t) < 256]
        got = first_number(bytes(toks).decode("utf-8", "replace"))
        scores[i] = 1.0 if got is not None and got == answers_rep[i] else 0.0
    ids, pos, valid, P = pack_full(prompts_rep, resp, lengths, a.pad)
    ref_lp = torch.zeros(S, R)
    values = torch.zeros(S, R)
    with torch.no_grad():
        for s0 in range(0, S, a.micro):
            sl = slice(s0, s0 + a.micro)
            lp, _ = response_outputs(ref, ids[sl], pos[sl], valid[sl], P, R, a.temperature, False)
            ref_lp[sl] = lp.gather(2, resp[sl, :, None].clamp(max=lp.shape[-1] - 1)).squeeze(2)
            v, _ = response_outputs(critic, ids[sl], pos[sl], valid[sl], P, R, 1.0, True)
            values[sl] = v
    ref_lp *= mask
    values *= mask
    t2 = time.perf_counter()
    st["score"] = t2 - t1
    # token rewards with the KL penalty, GAE, whitening
    rewards = -a.kl_coef * (old_lp - ref_lp) * mask
    last = (lengths - 1).clamp(min=0)
    rewards[torch.arange(S), last] += scores
    adv = torch.zeros(S, R)
    lastgae = torch.zeros(S)
    for t in reversed(range(R)):
        nextv = values[:, t + 1] if t + 1 < R else torch.zeros(S)
        delta = rewards[:, t] + a.gamma * nextv - values[:, t]
        lastgae = delta + a.gamma * a.lam * lastgae
        adv[:, t] = lastgae
    returns = (adv + values) * mask
    if not a.no_whiten:
        adv = masked_whiten(adv, mask) * mask
    t3 = time.perf_counter()
    st["advantage"] = t3 - t2
    # critic, then actor
    for model, opt, is_actor in ((critic, opt_c, False), (actor, opt_a, True)):
        mini = a.mini if is_actor or not a.critic_mini else a.critic_mini
        micro = a.micro if is_actor or not a.critic_micro else a.critic_micro
        for _ in range(a.epochs):
            perm = torch.randperm(S, generator=gen)
            for m0 in range(0, S, mini):
                mb = perm[m0:m0 + mini]
                denom = mask[mb].sum()
                opt.zero_grad()
                for u0 in range(0, len(mb), micro):
                    idx = mb[u0:u0 + micro]
                    m = mask[idx]
                    if is_actor:
                        lp_all, logits = response_outputs(model, ids[idx], pos[idx], valid[idx], P, R, a.temperature, False)
                        lp = lp_all.gather(2, resp[idx, :, None]).squeeze(2)
                        with torch.no_grad():
                            _ = -(lp_all.exp() * lp_all).sum(-1)  # entropy, a logged metric
                        ratio = torch.exp((lp - old_lp[idx]).clamp(-20, 20))
                        A = adv[idx]
                        l1 = -A * ratio
                        l2 = -A * ratio.clamp(1 - a.clip, 1 + a.clip)
                        l = torch.max(l1, l2)
                        l = torch.where(A < 0, torch.min(l, -A * a.clip_c), l)
                    else:
                        v, _ = response_outputs(model, ids[idx], pos[idx], valid[idx], P, R, 1.0, True)
                        old_v = values[idx]
                        vc = old_v + (v - old_v).clamp(-a.clip_value, a.clip_value)
                        l = 0.5 * torch.max((v - returns[idx]) ** 2, (vc - returns[idx]) ** 2)
                    loss = (l * m).sum() / denom
                    loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
                opt.step()
        t4 = time.perf_counter()
        st["train_actor" if is_actor else "train_critic"] = t4 - t3
        t3 = t4
    with torch.no_grad():
        for p_dst, p_src in zip(gen_model.parameters(), actor.parameters()):
            p_dst.copy_(p_src)
    st["sync"] = time.perf_counter() - t3
    st["total"] = time.perf_counter() - t0
    return st, float(scores.mean()), float(lengths.float().mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="prompts per iteration")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--mini", type=int, default=128, help="samples per optimizer step")
    ap.add_argument("--micro", type=int, default=64, help="samples per forward/backward")
    ap.add_argument("--critic-mini", type=int, default=0, help="critic samples per step (0: --mini)")
    ap.add_argument("--critic-micro", type=int, default=0, help="critic samples per forward (0: --micro)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--no-whiten", action="store_true", help="do not whiten the GAE advantages")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--critic-lr", type=float, default=1e-4)
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--gamma", type=float, default=1.0)
    ap.add_argument("--lam", type=float, default=0.95)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--clip-c", type=float, default=3.0)
    ap.add_argument("--clip-value", type=float, default=0.5)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cfg, w = load_model_dir(a.model)
    eos = cfg.get("eos_token_id")
    a.eos = eos[0] if isinstance(eos, list) else eos
    a.pad = cfg.get("pad_token_id") if cfg.get("pad_token_id") is not None else 0
    actor = Llama(cfg, w)
    gen_model = copy.deepcopy(actor)
    ref = copy.deepcopy(actor)
    critic = Llama(cfg, w, value_head=True)
    for p in list(ref.parameters()) + list(gen_model.parameters()):
        p.requires_grad_(False)
    opt_a = torch.optim.AdamW(actor.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    opt_c = torch.optim.AdamW(critic.parameters(), lr=a.critic_lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    rows = [json.loads(l) for l in open(a.prompts) if l.strip()]
    gen = torch.Generator().manual_seed(a.seed)
    times, stages = [], []
    for r in range(a.reps + 1):  # the first iteration warms up
        batch = [rows[(r * a.batch + i) % len(rows)] for i in range(a.batch)]
        st, reward, length = ppo_iteration(a, actor, gen_model, critic, ref, opt_a, opt_c, [b["ids"] for b in batch],
                                           [b["answer"] for b in batch], gen)
        print(f"torch iteration {r}: {st['total']:.3f} s (reward {reward:.3f}, mean response {length:.2f} tokens)"
              + ("  [warm-up]" if r == 0 else ""), flush=True)
        if r > 0:
            times.append(st["total"])
            stages.append(st)
    med = sorted(times)[len(times) // 2]
    keys = stages[0].keys()
    print(json.dumps({"iter_s": med, "stages": {k: sorted(s[k] for s in stages)[len(stages) // 2] for k in keys},
                      "threads": a.threads, "reps": a.reps, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
