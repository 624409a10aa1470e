#!/usr/bin/env bash
# `fuseflow devices`: the cores a worker may use; without a CUDA driver, no GPU and why, with the
# cuda backend's own words and NCCL unavailable; a driver that lists GPUs the cuda runtime cannot
# open (the stand-in driver FF_FAKE_LIBCUDA beside a build that has no device) gives each GPU a
# row naming the backend's error; --json says the same; a bad option is refused. With
# FF_CUDA_EMU_BIN (ctest's cli/test_devices_emu) the emulator's build opens the GPUs: capacity,
# what is free beside what other processes hold (FF_CUDA_EMU_OTHERS), the products' precision
# (FF_CUDA_MATH), and a GPU listed past the runtime's count refused by name.
source "$(dirname "$0")/lib.sh"
cores=$(nproc)

FF_LIBCUDA=/nonexistent/libcuda.so.1 "$FF_BIN" devices >"$TMP/out" 2>"$TMP/err"
rc=$?
((rc == 0)) && ok "no driver: exit 0" || fail "no driver: exit $rc: $(cat "$TMP/err")"
grep -qE "^machine: ($cores cores|[0-9]+ of $cores cores), no GPU \(no CUDA driver \(/nonexistent/libcuda.so.1 not found\)\)$" "$TMP/out" &&
  ok "no driver: the machine line says why" || fail "no driver: $(cat "$TMP/out")"
grep -qE "^cuda backend: (no CUDA device|.*built without the CUDA backend|opens a device the driver does not list)" "$TMP/out" &&
  ok "no driver: the cuda backend's words" || fail "no driver: no cuda backend line: $(cat "$TMP/out")"
grep -q "^nccl: unavailable: " "$TMP/out" && ok "no driver: NCCL unavailable, saying why" || fail "no driver: $(cat "$TMP/out")"

FF_LIBCUDA=/nonexistent/libcuda.so.1 "$FF_BIN" devices --json >"$TMP/j" 2>"$TMP/err" || fail "--json: exit $?"
python3 - "$TMP/j" "$cores" <<'PY' && ok "--json: cores, no GPU, why" || fail "--json: $(cat "$TMP/j")"
import json, sys
o = json.load(open(sys.argv[1]))
assert o["cores"] == int(sys.argv[2]) and 1 <= o["cpus"] <= o["cores"], o
assert o["gpus"] == [] and "no CUDA driver" in o["no_gpu"] and o["cuda_backend"], o
assert o["nccl"]["available"] is False and o["nccl"]["why"], o
PY

expect_error "a bad option" "unknown option --gpus" "$FF_BIN" devices --gpus
expect_ok "--help" "$FF_BIN" devices --help
grep -q "usage: fuseflow devices" "$TMP/out" && ok "--help: usage" || fail "--help: $(head -3 "$TMP/out")"

# a driver listing two GPUs that this build's cuda runtime cannot open: a row each, with why
if [[ -f ${FF_FAKE_LIBCUDA:-} && -z ${FF_CUDA_EMU_BIN:-} ]] && ! command -v nvidia-smi >/dev/null; then
  env FF_LIBCUDA="$FF_FAKE_LIBCUDA" "FAKE_CUDA_GPUS=Fake A100,Fake A100" "$FF_BIN" devices --json >"$TMP/j" 2>"$TMP/err" ||
    fail "listed but unopened GPUs: exit $?"
  python3 - "$TMP/j" <<'PY' && ok "GPUs the driver lists and the backend cannot open: named, with the backend's error" || fail "$(cat "$TMP/j")"
import json, sys
o = json.load(open(sys.argv[1]))
g = o["gpus"]
assert [r["index"] for r in g] == [0, 1] and all(r["name"] == "Fake A100" and r["error"] for r in g), g
assert all("capacity_bytes" not in r for r in g), g
PY
fi

if [[ -n ${FF_CUDA_EMU_BIN:-} ]]; then
  emu=(env FF_LIBCUDA="$FF_FAKE_LIBCUDA" "FAKE_CUDA_GPUS=emulated GPU,emulated GPU" FF_CUDA_EMU_DEVICES=2)
  "${emu[@]}" FF_CUDA_EMU_OTHERS=1073741824 "$FF_CUDA_EMU_BIN" devices >"$TMP/out" 2>"$TMP/err" || fail "emulator: exit $?"
  grep -q "^machine: .*2 GPUs: 2 x emulated GPU$" "$TMP/out" && grep -q "^cuda:1   emulated GPU: 80 GiB, 79 GiB free; bf16 products$" "$TMP/out" &&
    grep -q "^nccl: available$" "$TMP/out" && ok "emulator: each GPU's memory, what is free, bf16 products; NCCL" ||
    fail "emulator: $(cat "$TMP/out" "$TMP/err")"
  "${emu[@]}" FF_CUDA_EMU_OTHERS=1073741824 FF_CUDA_MATH=fp32 "$FF_CUDA_EMU_BIN" devices --json >"$TMP/j" || fail "emulator --json: exit $?"
  python3 - "$TMP/j" <<'PY' && ok "emulator --json: capacity, free beside the others' 1 GiB, fp32 products" || fail "$(cat "$TMP/j")"
import json, sys
g = json.load(open(sys.argv[1]))["gpus"]
assert [r["backend"] for r in g] == ["cuda:0", "cuda:1"], g
assert all(r["capacity_bytes"] == 80 << 30 and r["free_bytes"] == (80 << 30) - (1 << 30) and r["bf16_products"] is False for r in g), g
PY
  env FF_LIBCUDA="$FF_FAKE_LIBCUDA" "FAKE_CUDA_GPUS=emulated GPU,emulated GPU" FF_CUDA_EMU_DEVICES=1 "$FF_CUDA_EMU_BIN" devices >"$TMP/out" 2>&1 ||
    fail "one runtime device of two listed: exit $?"
  grep -q "^cuda:1   emulated GPU: the cuda backend cannot open it: .*requested but 1 CUDA device" "$TMP/out" &&
    ok "a GPU the runtime does not count: refused by name" || fail "one of two: $(cat "$TMP/out")"
fi
finish
