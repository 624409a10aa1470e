#!/usr/bin/python3
"""The PyTorch side of bench/bench_rlhf.c: the same RLHF host math the way verl computes it
(padded [B, L] tensors, autograd for the loss gradients, GAE as a Python loop over L), on
the same shapes, one thread. Prints one line per op: `name seconds` (best of the repeats).
usage: bench_rlhf_torch.py B L REPEATS
"""
import sys
import time

import torch

torch.set_num_threads(1)
B, L, R = (int(a) for a in sys.argv[1:4])
g = torch.Generator().manual_seed(0)
mask = (torch.rand(B, L, generator=g) > 0.1).float()
old = torch.randn(B, L, generator=g)
logp0 = old + 0.3 * torch.randn(B, L, generator=g)
ref = torch.randn(B, L, generator=g)
adv = torch.randn(B, L, generator=g)
rew = torch.randn(B, L, generator=g)
val = torch.randn(B, L, generator=g)


def best(fn):
    t = float("inf")
    for _ in range(R):
        s = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - s)
    return t


def ppo():
    logp = logp0.clone().requires_grad_(True)
    ratio = torch.exp(torch.clamp(logp - old, -20, 20))
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 0.8, 1.28)
    c1 = torch.maximum(l1, l2)
    pg = torch.where(adv < 0, torch.minimum(-adv * 3.0, c1), c1)
    loss = (pg * mask).sum() / mask.sum()
    loss.backward()
    return logp.grad


def k3():
    logp = logp0.clone().requires_grad_(True)
    kl = torch.clamp(ref - logp, -20, 20)
    kld = torch.clamp(torch.exp(kl) - kl - 1, -10, 10)
    loss = (kld * mask).sum() / mask.sum()
    loss.backward()
    return logp.grad


def gae():
    with torch.no_grad():
        nextv = torch.zeros(B)
        last = torch.zeros(B)
        out = []
        for t in reversed(range(L)):
            delta = rew[:, t] + nextv - val[:, t]
            la = delta + 0.95 * last
            nextv = val[:, t] * mask[:, t] + (1 - mask[:, t]) * nextv
            last = la * mask[:, t] + (1 - mask[:, t]) * last
            out.append(last)
        a = torch.stack(out[::-1], dim=1)
        return a, a + val


for name, fn in (("ppo_loss_grad", ppo), ("kl_k3_loss_grad", k3), ("gae", gae)):
    print(name, best(fn), flush=True)
