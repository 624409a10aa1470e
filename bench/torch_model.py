#!/usr/bin/python3
"""The PyTorch side of bench/bench_model.c: the same Llama-family model, the same work.

A straightforward PyTorch implementation, what a user would write without fuseflow: eager
attention with a causal mask (torch 1.13 has no fused attention on CPU), F.cross_entropy,
clip_grad_norm_, torch.optim.AdamW (decay on 2-D weights), and for decoding a preallocated
KV cache with temperature sampling through torch.multinomial under inference_mode.

bench_model.c runs this script in the same run with the same thread count and the same
configs, and reads the lines it prints:
    train SIZE TOKENS_PER_S
    decode SIZE TOKENS_PER_S
Usage: torch_model.py --threads N --size NAME,VOCAB,HIDDEN,INTER,LAYERS,HEADS,KV,TIED,SEQS,LEN,STEPS,DBATCH,DPROMPT,DNEW ...
"""
import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def __init__(self, V, H, I, L, Hq, Hkv, tied, theta=10000.0, eps=1e-5, max_pos=4096):
        super().__init__()
        self.V, self.H, self.Hq, self.Hkv, self.D, self.eps = V, H, Hq, Hkv, H // Hq, eps
        D = self.D
        init = lambda *s: torch.nn.Parameter(torch.randn(*s) * 0.02)
        self.embed = init(V, H)
        self.layers = torch.nn.ModuleList()
        for _ in range(L):
            l = torch.nn.Module()
            l.ln1, l.ln2 = torch.nn.Parameter(torch.ones(H)), torch.nn.Parameter(torch.ones(H))
            l.wq, l.wk, l.wv = init(Hq * D, H), init(Hkv * D, H), init(Hkv * D, H)
            l.wo = init(H, Hq * D)
            l.wg, l.wu, l.wd = init(I, H), init(I, H), init(H, I)
            self.layers.append(l)
        self.norm = torch.nn.Parameter(torch.ones(H))
        self.lm = None if tied else init(V, H)
        inv = 1.0 / (theta ** (torch.arange(0, D, 2).float() / D))
        ang = torch.arange(max_pos).float()[:, None] * inv[None, :]
        emb = torch.cat((ang, ang), -1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    @staticmethod
    def rot(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), -1)

    def rope(self, x, pos):  # x [B, heads, T, D], pos [T]
        c, s = self.cos[pos], self.sin[pos]
        return x * c + self.rot(x) * s

    def block(self, l, x, pos, cache=None, start=0):
        B, T, _ = x.shape
        D, Hq, Hkv = self.D, self.Hq, self.Hkv
        h = self.rms(x, l.ln1)
        q = (h @ l.wq.T).view(B, T, Hq, D).transpose(1, 2)
        k = (h @ l.wk.T).view(B, T, Hkv, D).transpose(1, 2)
        v = (h @ l.wv.T).view(B, T, Hkv, D).transpose(1, 2)
        q, k = self.rope(q, pos), self.rope(k, pos)
        if cache is not None:
            kc, vc = cache
            kc[:, :, start:start + T] = k
            vc[:, :, start:start + T] = v
            k, v = kc[:, :, :start + T], vc[:, :, :start + T]
        rep = Hq // Hkv
        k = k.repeat_interleave(rep, 1)
        v = v.repeat_interleave(rep, 1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        if T > 1:
            n = k.shape[2]
            mask = torch.ones(T, n, dtype=torch.bool).tril(n - T)
            s = s.masked_fill(~mask, float("-inf"))
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, Hq * D)
        x = x + a @ l.wo.T
        h = self.rms(x, l.ln2)
        return x + (F.silu(h @ l.wg.T) * (h @ l.wu.T)) @ l.wd.T

    def forward(self, tokens, caches=None, start=0):
        B, T = tokens.shape
        pos = torch.arange(start, start + T)
        x = self.embed[tokens]
        for i, l in enumerate(self.layers):
            x = self.block(l, x, pos, None if caches is None else caches[i], start)
        x = self.rms(x, self.norm)
        return x @ (self.embed if self.lm is None else self.lm).T


def bench_train(m, seqs, length, steps, V):
    decay = [p for p in m.parameters() if p.dim() == 2]
    rest = [p for p in m.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=1e-4)
    g = torch.Generator().manual_seed(0)
    tok = torch.randint(0, V, (seqs, length), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = m(tok[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), tok[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()

    step()  # warm-up
    best = float("inf")
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    return seqs * (length - 1) / best


@torch.inference_mode()
def bench_decode(m, B, prompt, new, V, L, Hkv, D, reps):
    g = torch.Generator().manual_seed(1)
    tok = torch.randint(0, V, (B, prompt), generator=g)

    def run():
        caches = [(torch.zeros(B, Hkv, prompt + new, D), torch.zeros(B, Hkv, prompt + new, D)) for _ in range(L)]
        logits = m(tok, caches, 0)[:, -1]
        out = []
        for i in range(new):
            p = torch.softmax(logits / 0.8, -1)
            nxt = torch.multinomial(p, 1, generator=g)
            lp = torch.log_softmax(logits, -1).gather(1, nxt)  # the log-prob fuseflow also returns
            out.append(nxt)
            if i + 1 < new:
                logits = m(nxt, caches, prompt + i)[:, -1]
        return out

    run()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return B * new / best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--size", action="append", required=True)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    for spec in a.size:
        f = spec.split(",")
        name = f[0]
        V, H, I, L, Hq, Hkv, tied, seqs, length, steps, dB, dP, dN = map(int, f[1:])
        m = Model(V, H, I, L, Hq, Hkv, bool(tied))
        print("train %s %.1f" % (name, bench_train(m, seqs, length + 1, steps, V)), flush=True)
        print("decode %s %.1f" % (name, bench_decode(m, dB, dP, dN, V, L, Hkv, H // Hq, a.reps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
