#!/usr/bin/env bash
# Installs what fuseflow builds and tests with, from Debian 12 packages. Run as root (or with
# sudo available). `--bench` adds what the benchmarks compare against (PyTorch, numpy), and
# tiktoken and Hugging Face tokenizers from PyPI into a venv for bench_tokenizer only
# (FF_BENCH_VENV, default ~/.cache/fuseflow/bench-venv, which the benchmark finds by itself),
# and OR-tools for bench/bench_fuse_exact.py (the fused solver against CP-SAT's exact optimum).
# The package manager's output goes to a log (FF_DEPS_LOG, else a new /tmp/fuseflow-deps.*
# file): here one line per step, and the log's last lines and its path when a step fails.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
# libclang-rt-14-dev: clang's libFuzzer and sanitizer runtimes (only recommended by clang, so
# --no-install-recommends leaves them out and the fuzz build of scripts/test.sh fails).
# munge, slurmctld, slurmd, slurm-client: tests/exec/test_run_slurm.sh starts a Slurm of its own
# (its own key, socket, ports and slurm.conf; the packages' services are not used).
pkgs=(build-essential cmake pkg-config clang libclang-rt-14-dev libomp-dev
      libopenblas-dev libzmq3-dev libmsgpack-dev libev-dev libjansson-dev libyaml-dev libpcre2-dev libutf8proc-dev libpng-dev libcairo2-dev fonts-dejavu-core
      python3 python3-zmq python3-msgpack iproute2 procps
      munge slurmctld slurmd slurm-client)
if [[ "${1:-}" == "--bench" ]]; then
  pkgs+=(python3-torch python3-numpy python3-venv)
fi
SUDO=()
if [[ $(id -u) -ne 0 ]]; then SUDO=(sudo); fi
if [[ ${#SUDO[@]} -gt 0 ]] && ! command -v sudo > /dev/null; then
  need_root=1
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
log=${FF_DEPS_LOG:-$(mktemp -t fuseflow-deps.XXXXXX)}
if (( ${#missing[@]} == 0 )); then
  echo "deps: all ${#pkgs[@]} packages installed"
else
  if [[ -n "${need_root:-}" ]]; then
    echo "deps: ${#missing[@]} of ${#pkgs[@]} packages are missing (${missing[*]}) and installing them needs root: run this as root, or install sudo" >&2
    exit 1
  fi
  echo "deps: installing ${#missing[@]} of ${#pkgs[@]} packages (${missing[*]}); the output goes to $log"
  ff_step "$log" "deps: apt-get update" "${SUDO[@]}" apt-get update
  ff_step "$log" "deps: apt-get install" "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
fi
if [[ "${1:-}" == "--bench" ]]; then
  venv=${FF_BENCH_VENV:-$HOME/.cache/fuseflow/bench-venv}
  if "$venv/bin/python" -c "import tiktoken, tokenizers, ortools" 2>/dev/null; then
    echo "deps: tiktoken, tokenizers and ortools ready in $venv"
  else
    ff_step "$log" "deps: venv $venv" python3 -m venv "$venv"
    ff_step "$log" "deps: pip install tiktoken tokenizers ortools (bench only)" "$venv/bin/pip" install -q tiktoken tokenizers ortools
  fi
fi
