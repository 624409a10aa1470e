#!/usr/bin/env python3
"""The PyTorch side of bench/bench_cuda.c: the same models, the same work, on the same GPU.

train   a straightforward Llama/Qwen2 module (what a user writes without fuseflow): fp32
        parameters under torch.autocast(bfloat16), F.scaled_dot_product_attention(is_causal)
        with the kv heads repeated (GQA), F.cross_entropy, clip_grad_norm_(1.0),
        torch.optim.AdamW (fused where this torch has it). --accum sequences (4) of --seq
        tokens a step, each its forward and backward (gradients accumulated), one clipping and
        optimizer step after; the median of --steps steps after two warm-up steps; MFU by
        bench_cuda.c's formula against 989 TFLOP/s.
decode  Hugging Face transformers' generate on the same config (random init, bfloat16),
        do_sample with temperature 1, exactly --new tokens (min_new_tokens), batch B of
        --prompt random tokens: the wall time of the call, after one untimed call (batch 1,
        4 new tokens) per model, as bench_cuda warms its decoding. Skipped, saying so, without
        transformers.

attention  the training attention alone, as bench_cuda's side by side: one sequence of --seq
        tokens with the model's heads, causal F.scaled_dot_product_attention forward and
        backward in bf16 (the key and value heads repeated for GQA before the timed calls), the
        median of 5 calls after one warm-up, at bench_cuda's FLOP count (6 Hq D seq^2).

Prints, like bench_cuda:
    torch_train MODEL: X tok/s, MFU Y %
    torch_attention MODEL: fwd+bwd X ms with SDPA, Y TFLOP/s
    hf_decode MODEL batch B: X tok/s
Exit 77 without torch or without a CUDA device. Usage: the flags of bench_cuda.c
(--models --seq --accum --steps --batches --prompt --new --budget), with its defaults and its
order: the models as --models names them (llama1b first), each's training then its decode
batches in --batches' order (32 first), so a spent budget cuts what the targets need last.

--device cpu --models tiny (a 2-layer, 128-wide model, bench_cuda's own smoke-test model) runs
the same code on the CPU (autocast to bf16 there too): a smoke test of this script against the
torch and transformers it will meet on the GPU machine (tests/arch/test_gpu_check.sh runs it
where python3, or FF_TORCH_PYTHON, has torch 2), whose figures mean nothing.
"""
import argparse
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("bench_cuda_torch: SKIPPED: no torch for this python3")
    sys.exit(77)

DEV = "cuda"  # --device


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


PEAK_TFLOPS = 989.0
CONFIGS = {
    "qwen0.5b": dict(V=151936, H=896, I=4864, L=24, Hq=14, Hkv=2, tied=True, bias=True, theta=1e6),
    "llama1b": dict(V=128256, H=2048, I=8192, L=16, Hq=32, Hkv=8, tied=True, bias=False, theta=5e5),
    # only when named: bench_cuda.c's "tiny", for the smoke test
    "tiny": dict(V=512, H=128, I=256, L=2, Hq=4, Hkv=2, tied=True, bias=False, theta=1e4),
}


def flops_per_token(c, seq):
    H, I, L, Hq, Hkv, V = c["H"], c["I"], c["L"], c["Hq"], c["Hkv"], c["V"]
    D = H // Hq
    per_layer = H * (Hq + 2 * Hkv) * D + Hq * D * H + 3 * H * I
    return 6.0 * (L * per_layer + H * V) + 6.0 * L * Hq * D * seq


class Model(torch.nn.Module):
    def __init__(self, c, max_pos=4096):
        super().__init__()
        V, H, I, L, Hq, Hkv = c["V"], c["H"], c["I"], c["L"], c["Hq"], c["Hkv"]
        self.Hq, self.Hkv, self.D = Hq, Hkv, H // Hq
        D = self.D
        dev = DEV
        init = lambda *s: torch.nn.Parameter(torch.randn(*s, device=dev) * 0.02)
        self.embed = init(V, H)
        self.layers = torch.nn.ModuleList()
        for _ in range(L):
            l = torch.nn.Module()
            l.ln1 = torch.nn.Parameter(torch.ones(H, device=dev))
            l.ln2 = torch.nn.Parameter(torch.ones(H, device=dev))
            l.wqkv = init((Hq + 2 * Hkv) * D, H)
            l.bqkv = torch.nn.Parameter(torch.zeros((Hq + 2 * Hkv) * D, device=dev)) if c["bias"] else None
            l.wo = init(H, Hq * D)
            l.wgu = init(2 * I, H)
            l.wd = init(H, I)
            self.layers.append(l)
        self.norm = torch.nn.Parameter(torch.ones(H, device=dev))
        inv = 1.0 / (c["theta"] ** (torch.arange(0, D, 2, device=dev).float() / D))
        ang = torch.outer(torch.arange(max_pos, device=dev).float(), inv)
        self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1), persistent=False)
        self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1), persistent=False)

    @staticmethod
    def rms(x, w, eps=1e-6):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w.to(x.dtype)

    def rope(self, x, T):
        c, s = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], -1)
        return x * c + rot * s

    def forward(self, tok):  # tok [B, T]
        B, T = tok.shape
        Hq, Hkv, D = self.Hq, self.Hkv, self.D
        x = F.embedding(tok, self.embed)
        for l in self.layers:
            h = self.rms(x, l.ln1)
            qkv = F.linear(h, l.wqkv, l.bqkv)
            q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], -1)
            q = self.rope(q.view(B, T, Hq, D).transpose(1, 2), T)
            k = self.rope(k.view(B, T, Hkv, D).transpose(1, 2), T)
            v = v.view(B, T, Hkv, D).transpose(1, 2)
            k = k.repeat_interleave(Hq // Hkv, 1)
            v = v.repeat_interleave(Hq // Hkv, 1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(a.transpose(1, 2).reshape(B, T, Hq * D), l.wo)
            g, u = F.linear(self.rms(x, l.ln2), l.wgu).chunk(2, -1)
            x = x + F.linear(F.silu(g) * u, l.wd)
        return F.linear(self.rms(x, self.norm), self.embed)


def bench_train(name, c, seq, steps, accum):
    torch.manual_seed(0)
    cuda = DEV == "cuda"
    held = torch.cuda.memory_allocated() if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats()  # the training's peak, less what was held before (as bench_cuda.c takes it)
    m = Model(c, max_pos=max(4096, seq))
    decay = [p for p in m.parameters() if p.dim() == 2]
    rest = [p for p in m.parameters() if p.dim() != 2]
    kw = {}
    try:
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1, device=DEV))], fused=True)
        kw["fused"] = True
    except (TypeError, RuntimeError):
        pass
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-5, **kw)
    tok = torch.randint(0, c["V"], (1, seq), device=DEV)
    times = []
    for i in range(steps + 2):
        sync()
        t0 = time.perf_counter()
        total = 0.0
        for _ in range(accum):  # the gradients add up over the step's sequences
            with torch.autocast(DEV, dtype=torch.bfloat16):
                logits = m(tok)
            loss = F.cross_entropy(logits[0, :-1].float(), tok[0, 1:]) / accum
            loss.backward()
            total += loss.detach()
            del logits, loss
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        dt = time.perf_counter() - t0
        times.append(dt)
        print(f"  {name} torch train step {i}: {dt * 1e3:.1f} ms, loss {total.item():.4f}, grad norm {norm.item():.3f}"
              + (" (warm-up)" if i < 2 else ""), flush=True)
    if cuda:
        print(f"  {name} torch train peak device memory: {(torch.cuda.max_memory_allocated() - held) / 2**30:.2f} GiB "
              f"(torch.cuda.max_memory_allocated: weights, gradients, AdamW, activations; {accum} x {seq} tokens a step)",
              flush=True)
    med = statistics.median(times[2:])
    tok_s = seq * accum / med
    mfu = 100.0 * flops_per_token(c, seq) * tok_s / (PEAK_TFLOPS * 1e12)
    del m, opt
    if cuda:
        torch.cuda.empty_cache()
    return tok_s, mfu


def bench_attention(c, seq):
    """fwd+bwd of causal SDPA on one sequence with the model's heads: (ms, TFLOP/s)."""
    Hq, Hkv, D = c["Hq"], c["Hkv"], c["H"] // c["Hq"]
    g = torch.Generator(device=DEV).manual_seed(3)
    shape = (1, Hq, seq, D)
    q = torch.rand(shape, device=DEV, generator=g, dtype=torch.bfloat16) * 2 - 1
    kv = [(torch.rand((1, Hkv, seq, D), device=DEV, generator=g, dtype=torch.bfloat16) * 2 - 1).repeat_interleave(Hq // Hkv, 1)
          for _ in range(2)]
    q, k, v = (t.detach().requires_grad_() for t in (q, *kv))
    dout = torch.rand(shape, device=DEV, generator=g, dtype=torch.bfloat16) * 2 - 1
    times = []
    for _ in range(6):
        sync()
        t0 = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        q.grad = k.grad = v.grad = None
    ms = statistics.median(times[1:])
    return ms, 6.0 * Hq * D * seq * seq / ms * 1e-9


def hf_model(c):
    import transformers

    common = dict(vocab_size=c["V"], hidden_size=c["H"], intermediate_size=c["I"], num_hidden_layers=c["L"],
                  num_attention_heads=c["Hq"], num_key_value_heads=c["Hkv"], rope_theta=c["theta"],
                  tie_word_embeddings=c["tied"], max_position_embeddings=4096, rms_norm_eps=1e-6)
    cfg = transformers.Qwen2Config(**common) if c["bias"] else transformers.LlamaConfig(**common)
    with torch.device(DEV):
        try:  # transformers 5 names it dtype; 4.x torch_dtype
            m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        except TypeError:
            m = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    return m.to(torch.bfloat16).eval()


def bench_decode(m, c, B, prompt, n_new):
    ids = torch.randint(0, c["V"], (B, prompt), device=DEV)
    att = torch.ones_like(ids)
    sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = m.generate(input_ids=ids, attention_mask=att, max_new_tokens=n_new, min_new_tokens=n_new,
                         do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)
    sync()
    dt = time.perf_counter() - t0
    return (out.shape[1] - prompt) * B / dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama1b,qwen0.5b")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--batches", default="32,1,256")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--budget", type=float, default=150)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    a = ap.parse_args()
    if a.seq < 2 or a.steps < 1 or a.accum < 1:
        ap.error("--seq >= 2, --steps and --accum >= 1")
    unknown = [n for n in a.models.split(",") if n not in CONFIGS]
    if unknown:
        ap.error(f"--models: unknown model {unknown[0]!r} (known: {', '.join(CONFIGS)})")
    global DEV
    DEV = a.device
    if DEV == "cuda" and not torch.cuda.is_available():
        print("bench_cuda_torch: SKIPPED: torch sees no CUDA device")
        return 77
    start = time.time()
    where = torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (a smoke test: its figures mean nothing)"
    print(f"bench_cuda_torch: torch {torch.__version__}, {where}, seq {a.seq}, {a.accum} a step", flush=True)
    try:
        import transformers

        have_hf = True
        print(f"bench_cuda_torch: transformers {transformers.__version__}")
    except ImportError:
        have_hf = False
        print("bench_cuda_torch: no transformers: the HF generate comparison is skipped")
    heads, failures = [], 0

    def head(line):  # at once (a run cut short keeps it) and again at the end
        print(line, flush=True)
        heads.append(line)

    for name in a.models.split(","):
        c = CONFIGS[name]
        if time.time() - start > a.budget:
            print(f"  {name}: skipped (budget of {a.budget:.0f} s spent)")
            continue
        try:  # one failing part (an API change, memory) must not lose the others
            tok_s, mfu = bench_train(name, c, a.seq, a.steps, a.accum)
            head(f"torch_train {name}: {tok_s:.0f} tok/s, MFU {mfu:.1f} % of {PEAK_TFLOPS:.0f} TFLOP/s "
                 f"(seq {a.seq}, {a.accum} a step, eager + autocast bf16 + SDPA)")
        except Exception as e:  # noqa: BLE001
            print(f"bench_cuda_torch: {name} train failed: {type(e).__name__}: {e}", flush=True)
            failures += 1
        try:
            ms, tflops = bench_attention(c, a.seq)
            head(f"torch_attention {name}: fwd+bwd {ms:.2f} ms with SDPA, {tflops:.1f} TFLOP/s (seq {a.seq}, "
                 f"{c['Hq']}/{c['Hkv']} heads, head_dim {c['H'] // c['Hq']}, bf16)")
        except Exception as e:  # noqa: BLE001
            print(f"bench_cuda_torch: {name} attention failed: {type(e).__name__}: {e}", flush=True)
            failures += 1
        if not have_hf:
            continue
        try:
            m = hf_model(c)
            bench_decode(m, c, 1, a.prompt, 4)  # untimed: the first call's one-time costs
            for B in [int(b) for b in a.batches.split(",")]:
                if time.time() - start > a.budget:
                    print(f"  {name} hf decode batch {B}: skipped (budget of {a.budget:.0f} s spent)")
                    continue
                r = bench_decode(m, c, B, a.prompt, a.new)
                head(f"hf_decode {name} batch {B}: {r:.0f} tok/s (HF generate, bf16, sampling)")
            del m
        except Exception as e:  # noqa: BLE001
            print(f"bench_cuda_torch: {name} HF generate failed: {type(e).__name__}: {e}", flush=True)
            failures += 1
        if DEV == "cuda":
            torch.cuda.empty_cache()
    print("bench_cuda_torch: headlines")
    for h in heads:
        print(h)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
