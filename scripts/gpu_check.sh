#!/usr/bin/env bash
# The one prepared check for the GPU machine (run from the repo root by the device tool).
#
# Prepare on the dev machine, then call the device tool:
#   scripts/gpu_prepare.sh      # builds .whl/ (gguf, and fallbacks) for Python 3.12
#   run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=540)
# Figures and logs land in $OUT (the device tool's output folder): summary.txt,
# kernels.json, parity.json, engine.json, one .log per step, kernel test junit XML.
#
# That machine has Python 3.12 with torch, triton, transformers, numpy and pytest
# and no network. The engine imports gguf at import time (GGUF loader), so the
# wheels from .whl/ are installed into /tmp/site first: gguf always, tqdm,
# safetensors and pyyaml only when the machine lacks them. Then, each step under
# its own timeout and the whole under TOTAL_S seconds (default 480, within 8 minutes):
#   1. environment report (versions, GPU, which model-format packages import);
#   2. the kernel tests and the runner's CUDA tests (graphs, memory profile),
#      compiled for CUDA, in three parallel shards so compilation uses several cores;
#   3. the attention kernel benchmark (triton vs SDPA, HBM fraction);
#   4. bf16 greedy parity on CUDA vs the fp32 CPU reference (SmolLM2 shape);
#   5. end-to-end engine decode/prefill figures (SmolLM2, then Llama-3-8B as time allows).
# Without CUDA it degrades to a dry run of the same steps (interpreter, --smoke),
# so the script itself can be checked on a CPU machine: PYTHON=.venv/bin/python.
# Exit status: 0 only when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-$PWD/var/gpu_check}
PY=${PYTHON:-python3}
TOTAL_S=${TOTAL_S:-480}
mkdir -p "$OUT"
unset TRITON_INTERPRET
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
failed=0

# Seconds left of the whole budget, capped at the step's own limit.
budget() {
  local left=$((TOTAL_S - SECONDS - 5))
  if ((left < $1)); then echo $((left > 1 ? left : 1)); else echo "$1"; fi
}

record() {  # name rc seconds
  echo "$1 rc=$2 ${3}s" | tee -a "$SUMMARY"
  if [ "$2" -ne 0 ]; then failed=1; fi
}

run_step() {  # name limit_s command...
  local name=$1 limit
  limit=$(budget "$2")
  shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  record "$name" "$rc" $((SECONDS - t0))
  grep -v "^{" "$OUT/$name.log" | tail -n 40  # the JSON line is in $OUT
}

# Carried wheels: gguf always; the others only where the machine has no such package.
if compgen -G ".whl/*.whl" >/dev/null; then
  wheels=(.whl/gguf-*.whl)
  for pair in tqdm:tqdm safetensors:safetensors yaml:pyyaml; do
    if ! "$PY" -c "import ${pair%%:*}" 2>/dev/null; then
      wheels+=(.whl/"${pair##*:}"-*.whl)
    fi
  done
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${wheels[@]}"; then
    export PYTHONPATH=/tmp/site:$PYTHONPATH
    echo "installed into /tmp/site: ${wheels[*]}" | tee -a "$SUMMARY"
  else
    echo "wheel install failed: ${wheels[*]}" | tee -a "$SUMMARY"
  fi
else
  echo "no .whl/ carried (run scripts/gpu_prepare.sh; carry [\".whl\"])" | tee -a "$SUMMARY"
fi

smoke=()
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "no CUDA device: dry run (TRITON_INTERPRET=1, bench --smoke)" | tee -a "$SUMMARY"
  export TRITON_INTERPRET=1
  smoke=(--smoke)
fi

run_step env 40 bash -c "$PY -c 'import sys, torch, triton; print(sys.version); print(\"torch\", torch.__version__, \"triton\", triton.__version__); print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"no cuda\")'
for m in gguf safetensors tqdm yaml transformers tokenizers engine.llm_engine; do
  $PY -c \"import \$m\" 2>/dev/null && echo \"import \$m: ok\" || echo \"import \$m: FAILED\"
done
nvidia-smi || true"

# Kernel and runner CUDA tests: three shards at once; each compiles its own kernels.
limit=$(budget 170)
echo "== tests (limit ${limit}s, 3 shards)"
t0=$SECONDS
shards=(
  "tests/engine/kernels/test_decode_attention.py"
  "tests/engine/kernels/test_prefill_attention.py"
  "tests/engine/kernels/test_kv_write.py tests/engine/kernels/test_fused_ops.py tests/engine/kernels/test_triton_backend.py tests/engine/kernels/test_import_surface.py tests/engine/runner/test_cuda_device.py"
)
pids=()
for i in "${!shards[@]}"; do
  # shellcheck disable=SC2086  # the shard is a list of paths
  timeout --kill-after=5 "$limit" "$PY" -m pytest -q -p no:cacheprovider \
    --junitxml="$OUT/tests_$i.xml" ${shards[$i]} >"$OUT/tests_$i.log" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  record "tests_$i" "$rc" $((SECONDS - t0))
  tail -n 15 "$OUT/tests_$i.log"
done

bench=(bench/gpu_decode.py "${smoke[@]}")
run_step kernels 100 "$PY" "${bench[@]}" --parts kernels --json-out "$OUT/kernels.json"
run_step parity 60 "$PY" "${bench[@]}" --parts parity --json-out "$OUT/parity.json"
# The engine part stops starting new sweeps 25 s before its step's limit.
engine_limit=$(budget 200)
run_step engine "$engine_limit" "$PY" "${bench[@]}" --parts engine \
  --engine-budget-s $((engine_limit > 60 ? engine_limit - 25 : engine_limit / 2)) \
  --json-out "$OUT/engine.json"

echo "== done in ${SECONDS}s, failed=$failed"
cat "$SUMMARY"
exit "$failed"
