#!/usr/bin/env bash
# The test command: builds fuseflow twice (Release, and ASan+UBSan), runs the whole ctest
# suite in each, then runs each libFuzzer target for a bounded time (FF_FUZZ_SECONDS, default
# 60). Exits non-zero on the first failure. Skipped tests (no GPU, no network namespaces)
# print why. First installs what is missing (scripts/deps.sh). Setup steps print one line
# each: the installer's output goes to its log, CMake's and the compiler's to
# build/test.log (a failed step shows the log's last lines and its path); the tests print
# their own lines.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
bash scripts/deps.sh
jobs=$(nproc)
fuzz_seconds=${FF_FUZZ_SECONDS:-60}
mkdir -p build
log=$PWD/build/test.log
: > "$log"

echo "== Release build (CMake and compiler output: $log)"
ff_step "$log" "build: configure Release" cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
ff_step "$log" "build: compile Release ($jobs jobs)" cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")

echo "== ASan + UBSan build"
ff_step "$log" "build: configure ASan+UBSan" cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFF_SANITIZE=ON -DFF_CUDA=OFF
ff_step "$log" "build: compile ASan+UBSan ($jobs jobs)" cmake --build build-asan -j"$jobs"
# OpenMP's and OpenBLAS's thread pools keep memory until exit; leaks there are not ours.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export FF_SANITIZED=1
(cd build-asan && ctest --output-on-failure -j"$jobs")

if ls fuzz/fuzz_*.c > /dev/null 2>&1; then
  echo "== libFuzzer targets (${fuzz_seconds}s each)"
  targets=$(for f in fuzz/fuzz_*.c; do basename "$f" .c; done)
  ff_step "$log" "build: configure libFuzzer (clang)" env CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFF_FUZZ=ON -DFF_CUDA=OFF
  ff_step "$log" "build: compile the fuzz targets" cmake --build build-fuzz -j"$jobs" --target $targets
  for f in build-fuzz/fuzz_*; do
    name=$(basename "$f")
    corpus=fuzz/corpus/${name#fuzz_}
    work=$(mktemp -d)
    [[ -d "$corpus" ]] && cp -r "$corpus"/. "$work"/
    echo "-- $name"
    "$f" -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 -print_final_stats=1 "$work" 2>&1 | tail -n 5
    rm -rf "$work"
  done
fi
echo "== all tests passed"
