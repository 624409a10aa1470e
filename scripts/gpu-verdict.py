#!/usr/bin/env python3
"""scripts/gpu-verdict.py RESULTS: issue 14's targets against one gpu-check run's results.txt.

Pairs the lines bench_cuda and bench_cuda_torch.py printed in the same run on the same GPU:
  bench_cuda_train MODEL: X tok/s, MFU Y % ...      with  torch_train MODEL: X tok/s, MFU Y % ...
  bench_cuda_decode MODEL batch B: X tok/s ...     with  hf_decode MODEL batch B: X tok/s ...
and, not a target but where the training's time may go, the attention alone:
  bench_cuda_attention MODEL: fwd+bwd X ms ...   with  torch_attention MODEL: fwd+bwd X ms ...
and prints, per model (and batch), fuseflow's figure, the other's and their ratio; for the
targets (training on llama1b: >= PyTorch eager's tokens/s and >= 40 % MFU; decoding at batch
32, both models: >= 3x HF generate) whether this run met them, or that a side was not measured. The last
line is the headline: `gpu_verdict: N of M targets met (...)`. It reads; it measures nothing.
Exit 0 (a target missed is a finding, not a failure of the script), 2 on bad usage.
"""
import re
import sys

TRAIN = re.compile(r"^(bench_cuda_train|torch_train) (\S+): ([0-9.]+) tok/s, MFU ([0-9.]+) %")
DECODE = re.compile(r"^(bench_cuda_decode|hf_decode) (\S+) batch (\d+): ([0-9.]+) tok/s")
ATTENTION = re.compile(r"^(bench_cuda_attention|torch_attention) (\S+): fwd\+bwd ([0-9.]+) ms")
MFU_TARGET, TRAIN_RATIO_TARGET, DECODE_RATIO_TARGET, DECODE_BATCH, TARGET_MODEL = 40.0, 1.0, 3.0, 32, "llama1b"
DECODE_MODELS = ("qwen0.5b", "llama1b")  # the issue names no model for decoding: both of the bench


def read(path):
    train, decode, attention, fp32_attention = {}, {}, {}, set()
    for line in open(path, encoding="utf-8", errors="replace"):
        m = TRAIN.match(line)
        if m:  # the last of repeated headlines wins (they are the same figures)
            side = "ff" if m.group(1) == "bench_cuda_train" else "torch"
            model, cores = m.group(2), side == "ff" and "FF_CUDA_ATTENTION=fp32" in line
            if cores and "ff" in train.get(model, {}) and model not in fp32_attention:
                continue  # gpu-check's second run (the first failed later): the first run's figure stands
            train.setdefault(model, {})[side] = (float(m.group(3)), float(m.group(4)))
            if cores:  # the attention on CUDA cores, not the tensor-core kernels
                fp32_attention.add(model)
            elif side == "ff":
                fp32_attention.discard(model)
            continue
        m = DECODE.match(line)
        if m:
            side = "ff" if m.group(1) == "bench_cuda_decode" else "hf"
            decode.setdefault((m.group(2), int(m.group(3))), {})[side] = float(m.group(4))
            continue
        m = ATTENTION.match(line)
        if m:
            side = "ff" if m.group(1) == "bench_cuda_attention" else "torch"
            attention.setdefault(m.group(2), {})[side] = float(m.group(3))
    return train, decode, attention, fp32_attention


def main(argv):
    if len(argv) != 2 or argv[1].startswith("-"):
        print("usage: scripts/gpu-verdict.py RESULTS (a gpu-check run's results.txt)", file=sys.stderr)
        return 2
    try:
        train, decode, attention, fp32_attention = read(argv[1])
    except OSError as e:
        print(f"gpu-verdict: cannot read {argv[1]}: {e.strerror}", file=sys.stderr)
        return 2
    met, total, missing = 0, 0, []

    def target(name, ok):
        nonlocal met, total
        total += 1
        if ok is None:
            missing.append(name)
            return "not measured"
        met += ok
        return "met" if ok else "NOT met"

    print("== issue 14's targets in this run (the same GPU, side by side)")
    for model in sorted(set(train) | {TARGET_MODEL}):
        t = train.get(model, {})
        ff, th = t.get("ff"), t.get("torch")
        parts = [f"train {model}: fuseflow " + (f"{ff[0]:.0f} tok/s, MFU {ff[1]:.1f} %" if ff else "not measured") +
                 (" (attention on CUDA cores, FF_CUDA_ATTENTION=fp32)" if model in fp32_attention else ""),
                 "PyTorch eager " + (f"{th[0]:.0f} tok/s" if th else "not measured")]
        if ff and th:
            parts.append(f"{ff[0] / th[0]:.2f}x")
        if model == TARGET_MODEL:
            parts.append(f"target >= {TRAIN_RATIO_TARGET:g}x PyTorch: " +
                         target("train vs PyTorch", None if not (ff and th) else ff[0] >= TRAIN_RATIO_TARGET * th[0]))
            parts.append(f"target MFU >= {MFU_TARGET:g} %: " + target("train MFU", None if not ff else ff[1] >= MFU_TARGET))
        print("; ".join(parts))
    for model in sorted(attention):  # where the training's time may go; no target
        a = attention[model]
        ff, th = a.get("ff"), a.get("torch")
        parts = [f"attention {model} (fwd+bwd, no target): fuseflow " + (f"{ff:.2f} ms" if ff else "not measured"),
                 "PyTorch SDPA " + (f"{th:.2f} ms" if th else "not measured")]
        if ff and th:
            parts.append(f"{ff / th:.2f}x SDPA's time")
        print("; ".join(parts))
    keys = set(decode) | {(m, DECODE_BATCH) for m in DECODE_MODELS}
    for model, batch in sorted(keys):
        d = decode.get((model, batch), {})
        ff, hf = d.get("ff"), d.get("hf")
        parts = [f"decode {model} batch {batch}: fuseflow " + (f"{ff:.0f} tok/s" if ff else "not measured"),
                 "HF generate " + (f"{hf:.0f} tok/s" if hf else "not measured")]
        if ff and hf:
            parts.append(f"{ff / hf:.2f}x")
        if batch == DECODE_BATCH and model in DECODE_MODELS:
            parts.append(f"target >= {DECODE_RATIO_TARGET:g}x HF: " +
                         target(f"decode {model} batch {DECODE_BATCH}", None if not (ff and hf) else ff >= DECODE_RATIO_TARGET * hf))
        print("; ".join(parts))
    note = f"; not measured: {', '.join(missing)}" if missing else ""
    print(f"gpu_verdict: {met} of {total} targets met (target: {total} of {total}{note})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
