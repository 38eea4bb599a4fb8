#!/usr/bin/env bash
# The one prepared check for the GPU machine (run from the repo root by the device tool).
#
# That machine has Python 3.12 with torch, triton, numpy and pytest only, and no
# network, so this installs nothing. It runs, each step under its own timeout and
# the whole under TOTAL_S seconds (default 450, below the 8-minute slot):
#   1. environment report (versions, GPU);
#   2. the kernel tests compiled for CUDA (TRITON_INTERPRET unset), in three parallel
#      shards so kernel compilation uses several cores;
#   3. bench/gpu_decode.py, whose JSON figures land in $OUT/gpu_decode.json.
# Logs go to $OUT (the device tool's output folder; ./var/gpu_check when unset).
# Without CUDA it degrades to a dry run of the same steps (interpreter, bench --smoke),
# so the script itself can be checked on a CPU machine: PYTHON=.venv/bin/python.
# Exit status: 0 only when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-$PWD/var/gpu_check}
PY=${PYTHON:-python3}
TOTAL_S=${TOTAL_S:-450}
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
  tail -n 25 "$OUT/$name.log"
}

bench_args=()
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "no CUDA device: dry run (TRITON_INTERPRET=1, bench --smoke)" | tee -a "$SUMMARY"
  export TRITON_INTERPRET=1
  bench_args=(--smoke)
fi

run_step env 30 bash -c "$PY -c 'import sys, torch, triton; print(sys.version); print(\"torch\", torch.__version__, \"triton\", triton.__version__); print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"no cuda\")'; nvidia-smi || true"

# Kernel tests: three shards at once; each compiles its own kernel variants.
limit=$(budget 240)
echo "== kernel tests (limit ${limit}s, 3 shards)"
t0=$SECONDS
shards=(
  "tests/engine/kernels/test_decode_attention.py"
  "tests/engine/kernels/test_prefill_attention.py"
  "tests/engine/kernels/test_kv_write.py tests/engine/kernels/test_fused_ops.py tests/engine/kernels/test_triton_backend.py tests/engine/kernels/test_import_surface.py"
)
pids=()
for i in "${!shards[@]}"; do
  # shellcheck disable=SC2086  # the shard is a list of paths
  timeout --kill-after=5 "$limit" "$PY" -m pytest -q -p no:cacheprovider \
    --junitxml="$OUT/kernel_tests_$i.xml" ${shards[$i]} >"$OUT/kernel_tests_$i.log" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  record "kernel_tests_$i" "$rc" $((SECONDS - t0))
  tail -n 15 "$OUT/kernel_tests_$i.log"
done

run_step bench 200 "$PY" bench/gpu_decode.py "${bench_args[@]}" --json-out "$OUT/gpu_decode.json"

echo "== done in ${SECONDS}s, failed=$failed"
cat "$SUMMARY"
exit "$failed"
