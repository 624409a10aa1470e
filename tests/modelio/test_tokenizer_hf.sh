#!/usr/bin/env bash
# Live comparison with Hugging Face's `tokenizers` on random input (tests/modelio/compare_hf.py):
# encoding and decoding equal for every tokenizer fixture. Skipped (77) where the library is not
# installed; it is the venv of `scripts/deps.sh --bench`, or FF_PYTHON.
source "$(dirname "$0")/../cli/lib.sh"
py=${FF_PYTHON:-$HOME/.cache/fuseflow/bench-venv/bin/python}
[[ -x "$py" ]] || py=python3
"$py" "$SRC/tests/modelio/compare_hf.py" "$FF_BIN" "$SRC" 400
