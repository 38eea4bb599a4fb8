#!/usr/bin/env bash
# The one prepared check for the GPU machine (run from the repo root by the device tool).
#
# Prepare on the dev machine, then call the device tool:
#   scripts/gpu_prepare.sh      # builds .whl/ (gguf, and fallbacks) for Python 3.12
#   run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=580)
# Figures and logs are written to a work folder and packed after every step into
# $OUT/gpu_check.tgz (the device tool returns at most 8 files); $OUT/summary.txt and
# $OUT/decode_vs_hf.png come back beside it. The archive holds kernel test logs and
# junit XML, gpu.json (every figure) and one .log per step.
#
# That machine has Python 3.12 with torch, triton, transformers, numpy and pytest
# and no network. The engine imports gguf at import time (GGUF loader), so the
# wheels from .whl/ are installed into /tmp/site first: gguf always, tqdm,
# safetensors and pyyaml only when the machine lacks them. Then, each step under
# its own timeout and the whole under TOTAL_S seconds (default 520):
#   1. environment report (versions, GPU, which model-format packages import);
#   2. the kernel tests and the runner's CUDA tests (graphs, memory profile),
#      compiled for CUDA, in three parallel shards so compilation uses several cores;
#   3. bench/gpu_decode.py, every part: the attention kernels (triton vs SDPA, HBM
#      fraction), bf16 greedy parity vs the fp32 CPU reference, the HF transformers
#      peer on the same weights (greedy parity, decode tokens/s ratio), end-to-end
#      engine decode/prefill figures (SmolLM2, then Llama-3-8B as time allows);
#   4. the plot of decode tokens/s vs batch, ours vs HF (where matplotlib imports).
# Without CUDA it degrades to a dry run of the same steps (interpreter, --smoke),
# so the script itself can be checked on a CPU machine: PYTHON=.venv/bin/python.
# Exit status: 0 only when every step passed. A shorter rerun picks its steps:
#   SHARDS="2" BENCH_PARTS=engine bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-$PWD/var/gpu_check}
LOGS=$(mktemp -d /tmp/gpu_check.XXXXXX)
PY=${PYTHON:-python3}
TOTAL_S=${TOTAL_S:-520}
mkdir -p "$OUT"
unset TRITON_INTERPRET
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
SUMMARY=$LOGS/summary.txt
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
  pack
}

pack() {  # what exists so far, so that a run cut short still returns its figures
  tar czf "$OUT/gpu_check.tgz" -C "$LOGS" . 2>/dev/null
  cp "$SUMMARY" "$OUT/summary.txt"
}

run_step() {  # name limit_s command...
  local name=$1 limit
  limit=$(budget "$2")
  shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=5 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  record "$name" "$rc" $((SECONDS - t0))
  grep -v "^{" "$LOGS/$name.log" | tail -n 60  # the JSON is in the archive
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
  "tests/engine/kernels/test_kv_write.py tests/engine/kernels/test_fused_ops.py tests/engine/kernels/test_triton_backend.py tests/engine/kernels/test_import_surface.py tests/engine/runner/test_cuda_device.py tests/engine/runner/test_cuda_graphs.py tests/engine/runner/test_memory.py"
)
pids=()
ran=()
for i in ${SHARDS:-${!shards[@]}}; do  # SHARDS="2": a rerun of one shard
  ran+=("$i")
  # shellcheck disable=SC2086  # the shard is a list of paths
  timeout --kill-after=5 "$limit" "$PY" -m pytest -q -p no:cacheprovider \
    --junitxml="$LOGS/tests_$i.xml" ${shards[$i]} >"$LOGS/tests_$i.log" 2>&1 &
  pids+=($!)
done
for k in "${!pids[@]}"; do
  wait "${pids[$k]}"
  rc=$?
  i=${ran[$k]}
  record "tests_$i" "$rc" $((SECONDS - t0))
  tail -n 15 "$LOGS/tests_$i.log"
done

# Every part in one process; gpu.json is rewritten after each part and engine shape,
# and the hf and engine parts start no new work once --wall-budget-s is used.
bench_limit=$(budget 330)
bench=(bench/gpu_decode.py "${smoke[@]}" --json-out "$LOGS/gpu.json"
  --parts "${BENCH_PARTS:-kernels,parity,hf,engine}"
  --hf-budget-s 100 --engine-budget-s 130 --wall-budget-s $((bench_limit - 15)))
run_step gpu_decode "$bench_limit" "$PY" "${bench[@]}"

if [[ ",${BENCH_PARTS:-hf}," != *,hf,* ]]; then
  echo "plot skipped: the hf part did not run" | tee -a "$SUMMARY"
elif "$PY" -c "import matplotlib" 2>/dev/null && [ -s "$LOGS/gpu.json" ]; then
  run_step plot 30 "$PY" bench/hf_peer.py --plot "$LOGS/gpu.json" "$OUT/decode_vs_hf.png"
else
  echo "plot skipped: no matplotlib or no gpu.json" | tee -a "$SUMMARY"
fi

echo "== done in ${SECONDS}s, failed=$failed"
pack
cat "$SUMMARY"
exit "$failed"
