#!/usr/bin/python3
"""PyTorch reference for fuseflow's model engine (model/, kernels/cpu/).

Builds the same Llama-family decoder as fuseflow from the same weights, in float64, written
out plainly after Hugging Face's LlamaModel / Qwen2Model (RMSNorm, rotate_half RoPE with
optional llama3 scaling, repeat_kv GQA, SwiGLU, q/k/v biases, tied or untied embeddings, a
scalar value head `score`). A packed batch of variable-length sequences is run with a
block-diagonal causal mask and positions restarting at 0 in each sequence.

For each case it writes two safetensors files into tests/fixtures/model/:
  CASE.weights.safetensors  the weights (Hugging Face names, F32), the config in __metadata__
  CASE.expect.safetensors   the batch and what the model must produce:
    tokens, seq_start, targets (I32); logits [T, V]; logprobs, entropy [T] (temperature 1);
    logprobs_t, entropy_t [T] (temperature 0.7); values [T] (with a value head);
    c_lp, c_ent, c_val [T]: the loss L = sum c_lp*logprob + c_ent*entropy + c_val*value;
    grad.NAME: dL/dNAME for every parameter; loss_ce [1]: token-mean cross-entropy;
    after3.NAME: every parameter after three AdamW steps on L (clipping, warmup + cosine);
    grad_norm [3], lr [3]: per step; the AdamW settings in __metadata__.

Run: /usr/bin/python3 tests/reference/ref_model.py   (Debian's python3-torch; CI does not
run this, the fixtures are committed). Deterministic: same files every run.
"""
import json
import math
import os
import struct
import sys

import torch

torch.set_default_dtype(torch.float64)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "model")

CASES = [
    dict(name="qwen_gqa_bias_value", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0,
         rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=True, value_head=True, rope_scaling=None,
         seq_lens=[70, 1, 13, 30], seed=1),
    dict(name="llama_tied_rope3", vocab_size=48, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=96, rope_theta=10000.0,
         rms_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=False, value_head=False,
         rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=64),
         seq_lens=[5, 40, 17], seed=2),
]
ADAMW = dict(lr=2e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, warmup_steps=2, total_steps=3,
             min_lr_ratio=0.1)
TEMPERATURE = 0.7


def tensor_names(c):
    L = c["num_hidden_layers"]
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    D = H // c["num_attention_heads"]
    qd, kd = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    out = [("model.embed_tokens.weight", [V, H])]
    for l in range(L):
        p = "model.layers.%d." % l
        out += [(p + "input_layernorm.weight", [H]), (p + "self_attn.q_proj.weight", [qd, H]),
                (p + "self_attn.k_proj.weight", [kd, H]), (p + "self_attn.v_proj.weight", [kd, H])]
        if c["attention_bias"]:
            out += [(p + "self_attn.q_proj.bias", [qd]), (p + "self_attn.k_proj.bias", [kd]),
                    (p + "self_attn.v_proj.bias", [kd])]
        out += [(p + "self_attn.o_proj.weight", [H, qd]), (p + "post_attention_layernorm.weight", [H]),
                (p + "mlp.gate_proj.weight", [I, H]), (p + "mlp.up_proj.weight", [I, H]),
                (p + "mlp.down_proj.weight", [H, I])]
    out.append(("model.norm.weight", [H]))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", [V, H]))
    if c["value_head"]:
        out.append(("score.weight", [1, H]))
    return out


def make_weights(c, gen):
    w = {}
    for name, shape in tensor_names(c):
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=gen)
        else:
            t = 0.15 * torch.randn(shape, generator=gen)
        w[name] = t.float().double()  # values representable in fp32, as the C side sees them
    return w


def inv_freq(c, D):
    f = [1.0 / (c["rope_theta"] ** (2 * i / D)) for i in range(D // 2)]
    rs = c["rope_scaling"]
    if rs:
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / lo, old / hi
        g = []
        for x in f:
            wavelen = 2 * math.pi / x
            if wavelen > low_wavelen:
                x = x / factor
            elif wavelen >= high_wavelen:
                smooth = (old / wavelen - lo) / (hi - lo)
                x = (1 - smooth) * x / factor + smooth * x
            g.append(x)
        f = g
    return torch.tensor(f, dtype=torch.float32)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(c, w, tokens, seq_start, targets, temperature=1.0):
    """Returns logits [T, V], logprobs [T], entropy [T], values [T] or None."""
    H, Hq, Hkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    D = H // Hq
    T = tokens.shape[0]
    eps = c["rms_norm_eps"]
    pos = torch.zeros(T, dtype=torch.int64)
    seq_id = torch.zeros(T, dtype=torch.int64)
    for s in range(len(seq_start) - 1):
        a, b = seq_start[s], seq_start[s + 1]
        pos[a:b] = torch.arange(b - a)
        seq_id[a:b] = s
    # angles as Hugging Face forms them: fp32 positions times fp32 inverse frequencies
    ang = (pos.float()[:, None] * inv_freq(c, D)[None, :]).double()
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]  # [T, 1, D]
    allowed = (seq_id[:, None] == seq_id[None, :]) & (torch.arange(T)[None, :] <= torch.arange(T)[:, None])
    x = w["model.embed_tokens.weight"][tokens]
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        if c["attention_bias"]:
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        q, k, v = q.view(T, Hq, D), k.view(T, Hkv, D), v.view(T, Hkv, D)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = Hq // Hkv
        k = k.repeat_interleave(rep, dim=1)  # repeat_kv: head h reads kv head h // rep
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        att = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, Hq * D)
        x = x + att @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
    xf = rms_norm(x, w["model.norm.weight"], eps)
    lm = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    logits = xf @ lm.T
    logp = torch.log_softmax(logits / temperature, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    tg = targets.clamp(min=0)
    lp = logp.gather(1, tg[:, None])[:, 0] * (targets >= 0)
    values = (xf @ w["score.weight"].T)[:, 0] if c["value_head"] else None
    return logits, lp, entropy, values


def lr_at(k):
    a = ADAMW
    if a["warmup_steps"] > 0 and k <= a["warmup_steps"]:
        return a["lr"] * k / a["warmup_steps"]
    if a["total_steps"] <= a["warmup_steps"]:
        return a["lr"]
    prog = min(1.0, (k - a["warmup_steps"]) / (a["total_steps"] - a["warmup_steps"]))
    return a["lr"] * (a["min_lr_ratio"] + (1 - a["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * prog)))


def write_safetensors(path, tensors, metadata):
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        if t.dtype in (torch.int32, torch.int64):
            data, dtype = t.to(torch.int32).contiguous().numpy().tobytes(), "I32"
        else:
            data, dtype = t.to(torch.float32).contiguous().numpy().tobytes(), "F32"
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def run_case(c):
    gen = torch.Generator().manual_seed(c["seed"])
    w = make_weights(c, gen)
    V = c["vocab_size"]
    seq_start = [0]
    for n in c["seq_lens"]:
        seq_start.append(seq_start[-1] + n)
    T = seq_start[-1]
    tokens = torch.randint(0, V, (T,), generator=gen)
    targets = torch.full((T,), -1, dtype=torch.int64)
    for s in range(len(seq_start) - 1):
        a, b = seq_start[s], seq_start[s + 1]
        targets[a:b - 1] = tokens[a + 1:b]
    c_lp = torch.randn(T, generator=gen) * (targets >= 0)
    c_ent = torch.randn(T, generator=gen)
    c_val = torch.randn(T, generator=gen) if c["value_head"] else None

    names = [n for n, _ in tensor_names(c)]
    params = {n: w[n].clone().requires_grad_(True) for n in names}

    def loss_of(ps):
        logits, lp, ent, val = forward(c, ps, tokens, seq_start, targets)
        L = (c_lp * lp).sum() + (c_ent * ent).sum()
        if val is not None:
            L = L + (c_val * val).sum()
        return L, logits, lp, ent, val

    L, logits, lp, ent, val = loss_of(params)
    L.backward()
    grads = {n: params[n].grad.detach().clone() for n in names}
    _, lp_t, ent_t, _ = forward(c, w, tokens, seq_start, targets, TEMPERATURE)
    nvalid = (targets >= 0).sum()
    loss_ce = -(lp.detach().sum() / nvalid)

    # three AdamW steps: torch.optim.AdamW, decay on 2-D weights only, clip_grad_norm_
    max_norm = 0.7 * math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    ps = {n: w[n].clone().requires_grad_(True) for n in names}
    decay = [ps[n] for n in names if ps[n].dim() == 2]
    no_decay = [ps[n] for n in names if ps[n].dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: lr_at(e + 1) / ADAMW["lr"])
    norms, lrs = [], []
    for _ in range(3):
        opt.zero_grad()
        Lk = loss_of(ps)[0]
        Lk.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(ps.values()), max_norm)))
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()

    cfg_meta = {k: c[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                                 "rope_theta", "rms_norm_eps")}
    for k in ("tie_word_embeddings", "attention_bias", "value_head"):
        cfg_meta[k] = int(c[k])
    rs = c["rope_scaling"]
    cfg_meta["rope_scaling"] = "llama3" if rs else "none"
    if rs:
        for k, v in rs.items():
            cfg_meta["rope_scaling." + k] = v
    os.makedirs(OUT, exist_ok=True)
    write_safetensors(os.path.join(OUT, c["name"] + ".weights.safetensors"), w, cfg_meta)

    ex = {"tokens": tokens, "seq_start": torch.tensor(seq_start), "targets": targets,
          "logits": logits.detach(), "logprobs": lp.detach(), "entropy": ent.detach(),
          "logprobs_t": lp_t, "entropy_t": ent_t, "c_lp": c_lp, "c_ent": c_ent,
          "loss_ce": loss_ce.reshape(1), "grad_norm": torch.tensor(norms), "lr": torch.tensor(lrs)}
    if val is not None:
        ex["values"] = val.detach()
        ex["c_val"] = c_val
    for n in names:
        ex["grad." + n] = grads[n]
        ex["after3." + n] = ps[n].detach()
    meta = {"temperature": TEMPERATURE, "max_grad_norm": repr(max_norm), "loss": repr(float(L))}
    meta.update({"adamw." + k: v for k, v in ADAMW.items()})
    write_safetensors(os.path.join(OUT, c["name"] + ".expect.safetensors"), ex, meta)
    print("%s: T=%d, loss %.6f, grad norms %s" % (c["name"], T, float(L), ["%.4f" % x for x in norms]))


if __name__ == "__main__":
    for case in CASES:
        run_case(case)
    sys.exit(0)
