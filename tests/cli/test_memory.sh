#!/usr/bin/env bash
# Resident memory of `fuseflow generate` and `fuseflow logprobs` stays within the bytes the
# weights need as fp32 (W = parameters x 4) x 1.1 + 32 MiB, on the small preset (25M
# parameters, W = 97 MiB) written in bf16.
#
# Why this bound: an inference model holds its parameters and no gradients; the checkpoint
# is converted tensor by tensor with its mapped pages dropped, and the host copy goes back
# while it is copied in, so the peak is W plus what any run of the command holds (about
# 13 MiB measured: the program, its libraries and threads, a conversion chunk of 8 MiB in
# flight, the rotary tables). 32 MiB leaves room for that and for allocator noise, 0.1 W for
# rounding that grows with the model. What it catches, measured on this model: the host
# tensors kept while the model is made (ff_model_new: 2.1 W), the whole bf16 file kept
# mapped while it is converted (1.6 W); a gradient buffer written would add W more. Before
# the inference mode the peak was 3.1 W (host copy, parameters and zeroed gradients at
# once). Under the sanitizers, ASan adds a shadow byte per 8 and its runtime (measured:
# W + 48 MiB), so the bound is 1.2 W + 64 MiB, which still catches a second copy.
source "$(dirname "$0")/lib.sh"

M="$TMP/small"
"$FF_BIN" init --preset small --out "$M" --dtype bf16 > /dev/null || { fail "init --preset small"; exit 1; }
echo '{"text": "12+34=46"}' > "$TMP/in.jsonl"

# peak resident KiB of a command (its exit status must be 0)
peak_kib() {
  python3 - "$@" <<'PY'
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
if rc.returncode != 0:
    sys.exit("exit %d: %s" % (rc.returncode, rc.stderr.decode()[:400]))
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
PY
}

# W in KiB: the parameters (from the safetensors header) x 4 bytes
w_kib=$(python3 - "$M/model.safetensors" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
n = 0
for k, v in h.items():
    if k != "__metadata__":
        p = 1
        for d in v["shape"]:
            p *= d
        n += p
print(n * 4 // 1024)
PY
)
if [[ "${FF_SANITIZED:-0}" == 1 ]]; then ratio=1.2 const_mib=64; else ratio=1.1 const_mib=32; fi
bound=$(python3 -c "print(int($w_kib * $ratio + $const_mib * 1024))")

check() { # WHAT CMD...
  local what=$1 kib
  shift
  if ! kib=$(peak_kib "$@" 2>"$TMP/err"); then fail "$what: $(cat "$TMP/err")"; return; fi
  local r
  r=$(python3 -c "print('%.2f' % ($kib / $w_kib))")
  if ((kib <= bound)); then
    ok "$what: peak $((kib / 1024)) MiB = $r x the weights' $((w_kib / 1024)) MiB (bound $((bound / 1024)) MiB)"
  else
    fail "$what: peak $((kib / 1024)) MiB = $r x the weights' $((w_kib / 1024)) MiB, over $ratio x + $const_mib MiB = $((bound / 1024)) MiB"
  fi
}
check "generate" "$FF_BIN" generate --model "$M" --prompt "12+34=" --max-new-tokens 8 --temperature 0
check "generate --n 4" "$FF_BIN" generate --model "$M" --prompt "12+34=" --max-new-tokens 8 --n 4 --seed 1
check "logprobs" "$FF_BIN" logprobs --model "$M" --input "$TMP/in.jsonl"
((FAILS == 0)) || exit 1
