#!/usr/bin/env bash
# Installs what fuseflow builds and tests with, from Debian 12 packages. Run as root (or with
# sudo available). `--bench` adds what the benchmarks compare against (PyTorch, numpy).
set -euo pipefail
pkgs=(build-essential cmake pkg-config clang libomp-dev
      libopenblas-dev libzmq3-dev libmsgpack-dev libev-dev libjansson-dev libyaml-dev libpcre2-dev libutf8proc-dev libpng-dev
      python3 python3-zmq python3-msgpack iproute2 procps)
if [[ "${1:-}" == "--bench" ]]; then
  pkgs+=(python3-torch python3-numpy)
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  echo "deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "deps: all installed"
fi
