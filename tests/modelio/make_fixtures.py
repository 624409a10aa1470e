#!/usr/bin/env python3
"""Makes the model-IO fixtures under tests/modelio/data with Hugging Face's own libraries, so
the C readers are checked against the reference implementations. CI does not run this: the
outputs are committed. Needs torch, safetensors and tokenizers, e.g.

    /usr/bin/python3 -m venv --system-site-packages /tmp/venv      # sees Debian's python3-torch
    /tmp/venv/bin/pip install safetensors tokenizers
    /tmp/venv/bin/python tests/modelio/make_fixtures.py
"""
import os
import sys

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")


def safetensors_fixture():
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
    save_file(tensors, os.path.join(DATA, "hf_written.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    os.makedirs(DATA, exist_ok=True)
    safetensors_fixture()
    if len(sys.argv) > 1 and sys.argv[1] == "--safetensors-only":
        sys.exit(0)
