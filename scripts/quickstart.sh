#!/usr/bin/env bash
# Installs the dependencies, builds fuseflow, and runs the bundled example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j"$(nproc)"
./build/fuseflow --help
