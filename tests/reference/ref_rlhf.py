#!/usr/bin/python3
"""Reference values for fuseflow's RLHF math (kernels/rlhf/, include/fuseflow/rlhf.h).

Computes every op of rlhf.h independently with PyTorch (Debian's python3-torch 1.13), in
float64, on random variable-length packed batches with masks: values, and derivatives by
autograd. Writes them as JSON fixtures that tests/rlhf/test_rlhf_ref.c compares against.
The formulas follow verl's core_algos.py (compute_policy_loss, compute_value_loss,
kl_penalty, compute_gae_advantage_return, compute_grpo_outcome_advantage, ...), written
here on padded [B, L] tensors, which is how verl holds them; the C code works on packed
[T] arrays. Inputs are rounded to float32 first, so both sides read identical numbers.

Usage: /usr/bin/python3 tests/reference/ref_rlhf.py [--out tests/reference/fixtures/rlhf.json]
(call /usr/bin/python3: the python3 first on PATH may not see Debian's torch).
CI does not run this; the fixtures are committed.
"""
import argparse
import json
import math
import os

import torch

torch.set_default_dtype(torch.float64)
G = torch.Generator().manual_seed(20240611)


def f32(x):
    """Round to float32 and back: the values the C side will read."""
    return torch.as_tensor(x, dtype=torch.float64).to(torch.float32).to(torch.float64)


def rnd(*shape, scale=1.0):
    return f32(torch.randn(*shape, generator=G) * scale)


# ---- batches -------------------------------------------------------------------------------

def make_batch(n_seq, max_len, empty=True, fully_masked=True):
    """Lengths in [1, max_len] (one empty sequence, one fully masked one), a mask with holes."""
    lens = [int(torch.randint(1, max_len + 1, (1,), generator=G)) for _ in range(n_seq)]
    if empty and n_seq > 2:
        lens[1] = 0
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    T = offsets[-1]
    mask = (torch.rand(T, generator=G) > 0.2).to(torch.float64)
    if fully_masked and n_seq > 3:
        mask[offsets[3]:offsets[4]] = 0
    return offsets, mask


def to_padded(x, offsets):
    """Packed [T] -> padded [B, L] (zeros after each sequence's end)."""
    B = len(offsets) - 1
    L = max([offsets[i + 1] - offsets[i] for i in range(B)] + [1])
    out = torch.zeros(B, L, dtype=x.dtype)
    for b in range(B):
        n = offsets[b + 1] - offsets[b]
        out[b, :n] = x[offsets[b]:offsets[b + 1]]
    return out


def to_packed(x, offsets):
    return torch.cat([x[b, : offsets[b + 1] - offsets[b]] for b in range(len(offsets) - 1)])


def seq_ids(offsets):
    ids = []
    for b in range(len(offsets) - 1):
        ids += [b] * (offsets[b + 1] - offsets[b])
    return torch.tensor(ids, dtype=torch.long)


# ---- verl's formulas ----------------------------------------------------------------------

def agg_loss(loss, mask, offsets, mode, denom=0.0):
    """verl agg_loss on packed tensors; a sequence with no counted token is not counted."""
    B = len(offsets) - 1
    ids = seq_ids(offsets)
    lm = loss * mask
    if mode == "token-mean":
        d = denom if denom > 0 else mask.sum()
        return lm.sum() / d if float(d) > 0 else lm.sum() * 0
    seq_sum = torch.zeros(B).index_add(0, ids, lm)
    seq_n = torch.zeros(B).index_add(0, ids, mask)
    live = seq_n > 0
    S = denom if denom > 0 else live.sum().to(torch.float64)
    if float(S) == 0:
        return lm.sum() * 0
    if mode == "seq-mean-token-sum":
        return seq_sum[live].sum() / S
    if mode == "seq-mean-token-mean":
        return (seq_sum[live] / seq_n[live]).sum() / S
    raise ValueError(mode)


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def masked_whiten(x, mask, shift_mean=True):
    n = mask.sum()
    mean = (x * mask).sum() / n
    if float(n) > 1:
        var = ((x - mean) ** 2 * mask).sum() / n * (n / (n - 1))
        w = (x - mean) * torch.rsqrt(var + 1e-8)
    else:
        w = x - mean
    return w if shift_mean else w + mean


def ppo_loss(logp, old, adv, mask, offsets, lo, hi, c, mode, denom):
    negative_approx_kl = torch.clamp(logp - old, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - lo, 1 + hi)
    clip1 = torch.maximum(l1, l2)
    stats = {"clipfrac": float(masked_mean(torch.gt(l2, l1).double(), mask)),
             "approx_kl": float(masked_mean(-negative_approx_kl, mask))}
    if c > 1:
        l3 = -adv * c
        clip2 = torch.minimum(l3, clip1)
        stats["clipfrac_lower"] = float(masked_mean((torch.gt(clip1, l3) * (adv < 0)).double(), mask))
        pg = torch.where(adv < 0, clip2, clip1)
    else:
        stats["clipfrac_lower"] = 0.0
        pg = clip1
    r = ratio.detach()[mask > 0]
    stats.update(ratio_mean=float(r.mean()), ratio_min=float(r.min()), ratio_max=float(r.max()))
    return agg_loss(pg, mask, offsets, mode, denom), stats


def value_loss(v, old_v, ret, mask, offsets, clip, mode, denom):
    l1 = (v - ret) ** 2
    if clip > 0:
        vc = torch.max(torch.min(v, old_v + clip), old_v - clip)  # verl clip_by_value
        l2 = (vc - ret) ** 2
        clipfrac = float(masked_mean(torch.gt(l2, l1).double(), mask))
        l = torch.maximum(l1, l2)
    else:
        clipfrac, l = 0.0, l1
    return 0.5 * agg_loss(l, mask, offsets, mode, denom), clipfrac


def kl_penalty(logp, ref, kind):
    if kind == "kl":
        return logp - ref
    if kind == "abs":
        return (logp - ref).abs()
    if kind == "mse":
        return 0.5 * (logp - ref).square()
    if kind == "low_var_kl":
        kl = torch.clamp(ref - logp, min=-20, max=20)
        ratio = torch.exp(kl)
        return torch.clamp(ratio - kl - 1, min=-10, max=10)
    raise ValueError(kind)


def gae(rewards, values, mask, gamma, lam):
    """verl compute_gae_advantage_return (observation tokens skipped), on [B, L]."""
    B, L = rewards.shape
    nextvalues = torch.zeros(B)
    lastgaelam = torch.zeros(B)
    out = []
    for t in reversed(range(L)):
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * mask[:, t] + (1 - mask[:, t]) * lastgaelam
        out.append(lastgaelam)
    adv = torch.stack(out[::-1], dim=1)
    return adv, adv + values


def discounted(rewards, mask, gamma):
    """Returns with observation tokens skipped: gae() with V = 0 and lam = 1."""
    adv, _ = gae(rewards, torch.zeros_like(rewards), mask, gamma, 1.0)
    return adv


def outcome_stats(scores, group):
    id2 = {}
    for i, g in enumerate(group):
        id2.setdefault(g, []).append(scores[i])
    mean, std, n = {}, {}, {}
    for g, v in id2.items():
        t = torch.stack(v)
        n[g] = len(v)
        if len(v) == 1:
            mean[g], std[g] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean[g], std[g] = t.mean(), t.std()
    return n, mean, std


def grpo(scores, group, norm_by_std, eps):
    n, mean, std = outcome_stats(scores, group)
    out = []
    for i, g in enumerate(group):
        a = scores[i] - mean[g]
        out.append(a / (std[g] + eps) if norm_by_std else a)
    return torch.stack(out)


def rloo(scores, group):
    n, mean, _ = outcome_stats(scores, group)
    out = []
    for i, g in enumerate(group):
        k = n[g]
        out.append(scores[i] * k / (k - 1) - mean[g] * k / (k - 1) if k > 1 else scores[i])
    return torch.stack(out)


# ---- cases ----------------------------------------------------------------------------------

def lst(x):
    return [float(v) for v in x.reshape(-1).tolist()]


def grad_of(fn, *xs):
    xs = [x.clone().requires_grad_(True) for x in xs]
    y = fn(*xs)
    gs = torch.autograd.grad(y, xs, allow_unused=True)
    return y.detach(), [g if g is not None else torch.zeros_like(x) for g, x in zip(gs, xs)]


def base(op, name, offsets, mask, **params):
    return {"op": op, "name": name, "offsets": offsets, "mask": lst(mask), "params": params, "inputs": {}, "outputs": {}}


AGGS = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]


def cases():
    out = []
    # aggregation
    for i, mode in enumerate(AGGS):
        for denom in (0.0, 17.0):
            offsets, mask = make_batch(7, 9)
            x = rnd(offsets[-1])
            y, (g,) = grad_of(lambda x: agg_loss(x, mask, offsets, mode, denom), x)
            c = base("agg", f"agg {mode} denom={denom}", offsets, mask, agg=mode, denom=denom)
            c["inputs"]["x"] = lst(x)
            c["outputs"].update(loss=float(y), dx=lst(g))
            out.append(c)
    # PPO clipped surrogate
    ppo_cfgs = [(0.2, 0.2, 3.0), (0.2, 0.28, 0.0), (0.1, 0.3, 2.0)]
    for (lo, hi, cc) in ppo_cfgs:
        for mode in AGGS:
            offsets, mask = make_batch(8, 10)
            T = offsets[-1]
            old = rnd(T)
            logp = f32(old + torch.randn(T, generator=G) * (0.35 if cc <= 1 else 0.7))
            logp[0] = f32(old[0] + 25.0)  # past the clamp of the log-ratio
            adv = rnd(T)
            denom = 0.0 if mode != "seq-mean-token-sum" else 9.0
            stats = {}

            def f(lp):
                y, st = ppo_loss(lp, old, adv, mask, offsets, lo, hi, cc, mode, denom)
                stats.update(st)
                return y

            y, (g,) = grad_of(f, logp)
            c = base("ppo", f"ppo lo={lo} hi={hi} c={cc} {mode}", offsets, mask, clip_low=lo, clip_high=hi, clip_c=cc,
                     agg=mode, denom=denom)
            c["inputs"].update(logp=lst(logp), old_logp=lst(old), adv=lst(adv))
            c["outputs"].update(loss=float(y), dlogp=lst(g), **stats)
            out.append(c)
    # plain policy gradient
    for mode in AGGS:
        offsets, mask = make_batch(6, 8)
        logp, adv = rnd(offsets[-1]), rnd(offsets[-1])
        y, (g,) = grad_of(lambda lp: agg_loss(-adv * lp, mask, offsets, mode), logp)
        c = base("pg", f"pg {mode}", offsets, mask, agg=mode, denom=0.0)
        c["inputs"].update(logp=lst(logp), adv=lst(adv))
        c["outputs"].update(loss=float(y), dlogp=lst(g))
        out.append(c)
    # value loss
    for clip in (0.2, 0.0):
        for mode in AGGS:
            offsets, mask = make_batch(7, 9)
            T = offsets[-1]
            old_v, ret = rnd(T), rnd(T)
            v = f32(old_v + torch.randn(T, generator=G) * 0.4)
            cf = {}

            def f(vv):
                y, cfrac = value_loss(vv, old_v, ret, mask, offsets, clip, mode, 0.0)
                cf["clipfrac"] = cfrac
                return y

            y, (g,) = grad_of(f, v)
            c = base("value", f"value clip={clip} {mode}", offsets, mask, clip=clip, agg=mode, denom=0.0)
            c["inputs"].update(v=lst(v), old_v=lst(old_v), ret=lst(ret))
            c["outputs"].update(loss=float(y), dv=lst(g), clipfrac=cf["clipfrac"])
            out.append(c)
    # KL estimators: per token, and as a loss
    for kind in ("kl", "abs", "mse", "low_var_kl"):
        offsets, mask = make_batch(6, 9)
        T = offsets[-1]
        ref = rnd(T)
        logp = f32(ref + torch.randn(T, generator=G) * 0.5)
        if kind == "low_var_kl":
            logp[0] = f32(ref[0] - 30.0)  # past both clamps
            logp[1] = f32(ref[1] - 3.0)   # past the clamp of the value (e^3 - 4 > 10)
        kl, (g,) = grad_of(lambda lp: kl_penalty(lp, ref, kind).sum(), logp)
        klv = kl_penalty(logp, ref, kind)
        for mode in ("token-mean", "seq-mean-token-mean"):
            y, (gl,) = grad_of(lambda lp: agg_loss(kl_penalty(lp, ref, kind), mask, offsets, mode), logp)
            c = base("kl", f"kl {kind} {mode}", offsets, mask, kind=kind, agg=mode, denom=0.0)
            c["inputs"].update(logp=lst(logp), ref=lst(ref))
            c["outputs"].update(kl=lst(klv), dkl=lst(g), loss=float(y), dlogp=lst(gl))
            out.append(c)
    # KL penalty in the reward
    offsets, mask = make_batch(6, 8)
    T = offsets[-1]
    scores, klv = rnd(T), rnd(T, scale=0.1)
    c = base("kl_penalty", "kl_penalty", offsets, mask, coef=0.05)
    c["inputs"].update(token_scores=lst(scores), kl=lst(klv))
    c["outputs"]["out"] = lst(scores - 0.05 * klv * mask)
    out.append(c)
    # GAE, and whitening
    for gamma, lam in ((1.0, 1.0), (0.99, 0.95), (0.9, 0.5)):
        offsets, mask = make_batch(8, 14)
        T = offsets[-1]
        r, v = rnd(T), rnd(T)
        adv, ret = gae(to_padded(r, offsets), to_padded(v, offsets), to_padded(mask, offsets), gamma, lam)
        adv, ret = to_packed(adv, offsets), to_packed(ret, offsets)
        c = base("gae", f"gae gamma={gamma} lam={lam}", offsets, mask, gamma=gamma, lam=lam)
        c["inputs"].update(rewards=lst(r), values=lst(v))
        c["outputs"].update(adv=lst(adv), ret=lst(ret), adv_whitened=lst(masked_whiten(adv, mask)))
        out.append(c)
    for shift in (True, False):
        offsets, mask = make_batch(6, 8)
        x = rnd(offsets[-1], scale=3.0) + 1.0
        c = base("whiten", f"whiten shift_mean={shift}", offsets, mask, shift_mean=shift)
        c["inputs"]["x"] = lst(x)
        c["outputs"]["out"] = lst(masked_whiten(x, mask, shift))
        out.append(c)
    # outcome advantages: groups of 4, 3, 1, 2 responses, scattered ids
    for est in ("grpo", "grpo_nostd", "rloo"):
        offsets, mask = make_batch(10, 7)
        group = [3, 3, 0, 3, 7, 0, 3, 9, 0, 7]  # sizes 4, 3, 2 and 1
        scores = f32(torch.randint(0, 3, (10,), generator=G).double() + rnd(10, scale=0.1))
        if est == "rloo":
            a = rloo(scores, group)
        else:
            a = grpo(scores, group, est == "grpo", 1e-6)
        ids = seq_ids(offsets)
        adv = a[ids] * mask
        c = base(est, est, offsets, mask, eps=1e-6)
        c["inputs"].update(scores=lst(scores), group=group)
        c["outputs"]["adv"] = lst(adv)
        out.append(c)
    for gamma in (1.0, 0.9):
        offsets, mask = make_batch(7, 9)
        T = offsets[-1]
        r = rnd(T)
        ret = to_packed(discounted(to_padded(r, offsets), to_padded(mask, offsets), gamma), offsets)
        c = base("reinforce_pp", f"reinforce++ gamma={gamma}", offsets, mask, gamma=gamma)
        c["inputs"]["rewards"] = lst(r)
        c["outputs"].update(ret=lst(ret), adv=lst(masked_whiten(ret, mask) * mask))
        out.append(c)
    offsets, mask = make_batch(7, 9)
    T = offsets[-1]
    r, b = rnd(T), rnd(7)
    # verl compute_remax_outcome_advantage: reverse cumsum of masked rewards minus the baseline
    rp, mp = to_padded(r, offsets), to_padded(mask, offsets)
    ret = (rp * mp).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advp = (ret - b.unsqueeze(-1)) * mp
    c = base("remax", "remax", offsets, mask)
    c["inputs"].update(rewards=lst(r), baseline=lst(b))
    c["outputs"].update(ret=lst(to_packed(ret, offsets)), adv=lst(to_packed(advp, offsets)))
    out.append(c)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "fixtures", "rlhf.json"))
    args = ap.parse_args()
    cs = cases()
    doc = {"generator": "tests/reference/ref_rlhf.py", "torch": torch.__version__, "cases": cs}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cs)} cases to {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
