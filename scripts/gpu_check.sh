#!/usr/bin/env bash
# The one prepared check for the GPU machine (run from the repo root by the device tool).
#
# Prepare on the dev machine, then call the device tool:
#   PYTHON=.venv/bin/python scripts/gpu_prepare.sh   # .whl/ and var/gpu/ (see there)
#   run(command="bash scripts/gpu_check.sh", carry=[".whl", "var/gpu"], timeout_s=580)
# Figures and logs are written to a work folder and packed after every step into
# $OUT/gpu_check.tgz (the device tool returns at most 8 files); $OUT/summary.txt,
# $OUT/decode_vs_hf.png, $OUT/serve_bench.json (SGLang's bench_serving),
# $OUT/serve_load.json (bench/serve_load.py) and $OUT/serve_path.txt come back beside it. The archive holds kernel test logs and junit XML, gpu.json (every
# figure), the server's log and one .log per step.
#
# That machine has Python 3.12 with torch, triton, transformers, numpy and pytest
# and no network. The engine imports gguf at import time (GGUF loader), so the
# wheels from .whl/ are installed into /tmp/site first: gguf always; tqdm,
# safetensors, pyyaml and the service's stack (.whl/web) where the machine lacks
# them or has an older version; SGLang's client's (.whl/client) likewise into
# /tmp/site-client, seen by that client only. Then, each step under its own timeout
# and the whole under TOTAL_S seconds (default 520), the steps STEPS names (default
# all, in this order):
#   env     versions, GPU, which packages import;
#   tests   the kernel tests, the fused-kernel model parity tests and the runner's
#           CUDA tests (graphs, memory profile), compiled for CUDA, in four
#           parallel shards so compilation uses several cores;
#   serve   scripts/gpu_serve_bench.sh: `cloister serve` with no engine flag on
#           random weights in SmolLM2-135M's shape (SERVE_SHAPE=llama-1b: a 1B
#           Llama), the engine path it picked (device, dtype, attention, fused ops,
#           CUDA graphs), then SGLang's bench_serving and bench/serve_load.py;
#   overlap bench/overlap.py on random weights in SmolLM2-135M's shape (the serve
#           shape): decode tokens/s and host time per step, steps in turn against
#           overlap scheduling, at batch 8 and 64;
#   decode  bench/gpu_decode.py, every part: the attention kernels (triton vs SDPA,
#           HBM fraction), bf16 greedy parity vs the fp32 CPU reference, the HF
#           transformers peer on the same weights (greedy parity, decode tokens/s
#           ratio), end-to-end engine decode/prefill figures (SmolLM2, then
#           Llama-3-8B as time allows, within what is left of TOTAL_S);
#   plot    decode tokens/s vs batch, ours vs HF (where matplotlib imports).
# Without CUDA it degrades to a dry run of the same steps (interpreter, --smoke,
# the tiny serve shape), so the script itself can be checked on a CPU machine:
# PYTHON=.venv/bin/python. Exit status: 0 only when every step run passed.
# A shorter rerun picks its steps:
#   STEPS=env,tests,serve bash scripts/gpu_check.sh      # issue 14: the GPU service
#   STEPS=tests SHARDS="2" bash scripts/gpu_check.sh
#   STEPS=decode BENCH_PARTS=engine bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-$PWD/var/gpu_check}
LOGS=$(mktemp -d /tmp/gpu_check.XXXXXX)
PY=${PYTHON:-python3}
TOTAL_S=${TOTAL_S:-520}
mkdir -p "$OUT"
unset TRITON_INTERPRET
export PYTHONPATH=$PWD:$PWD/platform${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
SUMMARY=$LOGS/summary.txt
: >"$SUMMARY"
failed=0
STEPS=${STEPS:-env,tests,serve,overlap,decode,plot}

want() { [[ ",$STEPS," == *",$1,"* ]]; }

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
  for f in serve_bench.json serve_load.json serve_path.txt; do
    if [ -f "$LOGS/$f" ]; then cp "$LOGS/$f" "$OUT/$f"; fi
  done
}

# The wheels among "$@" whose distribution this Python lacks or has in an older version.
needed_wheels() {
  "$PY" - "$@" <<'PY'
import importlib.metadata as md, os, sys
try:
    from packaging.version import Version as parse
except ImportError:  # no ordering then: any other version is replaced
    parse = str
for path in sys.argv[1:]:
    name, carried = os.path.basename(path).split("-")[:2]
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        print(path)
        continue
    try:
        older = parse(have) < parse(carried) if parse is not str else have != carried
    except Exception:
        older = have != carried
    if older:
        print(path)
PY
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

# Carried wheels: gguf always; the others only where the machine has no such package
# (the web stack and the client's: none, or an older version).
install_wheels() {  # target, then wheel files
  local target=$1
  shift
  if [ "$#" -eq 0 ]; then return 0; fi
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$target" "$@"; then
    echo "installed into $target: $(basename -a "$@" | cut -d- -f1 | tr '\n' ' ')" | tee -a "$SUMMARY"
  else
    echo "wheel install into $target failed: $*" | tee -a "$SUMMARY"
  fi
}
if compgen -G ".whl/*.whl" >/dev/null; then
  wheels=(.whl/gguf-*.whl)
  for pair in tqdm:tqdm safetensors:safetensors yaml:pyyaml; do
    if ! "$PY" -c "import ${pair%%:*}" 2>/dev/null; then
      wheels+=(.whl/"${pair##*:}"-*.whl)
    fi
  done
  if compgen -G ".whl/web/*.whl" >/dev/null; then
    mapfile -t -O "${#wheels[@]}" wheels < <(needed_wheels .whl/web/*.whl)
  fi
  install_wheels /tmp/site "${wheels[@]}"
  export PYTHONPATH=/tmp/site:$PYTHONPATH
  if compgen -G ".whl/client/*.whl" >/dev/null; then
    mapfile -t client < <(PYTHONPATH=$PYTHONPATH needed_wheels .whl/client/*.whl)
    install_wheels /tmp/site-client "${client[@]}"
  fi
else
  echo "no .whl/ carried (run scripts/gpu_prepare.sh; carry [\".whl\", \"var/gpu\"])" | tee -a "$SUMMARY"
fi

smoke=()
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "no CUDA device: dry run (TRITON_INTERPRET=1, bench --smoke, serve shape tiny)" | tee -a "$SUMMARY"
  export TRITON_INTERPRET=1
  smoke=(--smoke)
  export SERVE_SHAPE=${SERVE_SHAPE:-tiny} SERVE_PROMPTS=${SERVE_PROMPTS:-8}
  export SERVE_INPUT_LEN=${SERVE_INPUT_LEN:-32} SERVE_OUTPUT_LEN=${SERVE_OUTPUT_LEN:-16}
fi

want env && run_step env 40 bash -c "$PY -c 'import sys, torch, triton; print(sys.version); print(\"torch\", torch.__version__, \"triton\", triton.__version__); print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"no cuda\")'
for m in gguf safetensors tqdm yaml transformers tokenizers engine.llm_engine fastapi uvicorn sqlalchemy cloister.cli; do
  $PY -c \"import \$m\" 2>/dev/null && echo \"import \$m: ok\" || echo \"import \$m: FAILED\"
done
nvidia-smi || true"

# Kernel, runner CUDA and fused-model tests: four shards at once; each compiles its
# own kernels.
run_tests() {
  local limit t0 i k rc
  local shards=(
    "tests/engine/kernels/test_decode_attention.py"
    "tests/engine/kernels/test_prefill_attention.py"
    "tests/engine/kernels/test_kv_write.py tests/engine/kernels/test_fused_ops.py tests/engine/kernels/test_fused_moe.py tests/engine/kernels/test_rotary_partial.py tests/engine/kernels/test_triton_backend.py tests/engine/kernels/test_import_surface.py tests/engine/runner/test_cuda_device.py tests/engine/runner/test_cuda_graphs.py tests/engine/runner/test_memory.py"
    "tests/engine/model/test_fused_ops_in_model.py"
  )
  limit=$(budget 170)
  echo "== tests (limit ${limit}s, ${#shards[@]} shards)"
  t0=$SECONDS
  local pids=() ran=()
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
}
want tests && run_tests

# The service on the GPU: its own server process, stopped at the end of the step. Should
# the step be cut short, the server it left (pid in serve.pid) is stopped here: it holds
# most of the GPU's memory, which the decode benchmark needs.
if want serve; then
  run_step serve_bench 300 env LOGS="$LOGS" PYTHON="$PY" bash scripts/gpu_serve_bench.sh
  if [ -s "$LOGS/serve.pid" ] && kill -0 "$(cat "$LOGS/serve.pid")" 2>/dev/null; then
    kill -KILL "$(cat "$LOGS/serve.pid")"
    echo "stopped the server the serve step left running" | tee -a "$SUMMARY"
  fi
fi

# Overlap scheduling on the GPU, where a step is short and the host's share large.
if want overlap; then
  overlap_model=$LOGS/overlap-model
  overlap_device=cuda
  if ((${#smoke[@]})); then overlap_device=cpu; fi
  run_step overlap 100 bash -c "set -e
    '$PY' bench/serve_model.py --shape '${SERVE_SHAPE:-smollm2-135m}' \
      --tokenizer '${ASSETS:-var/gpu}/tokenizer' --out '$overlap_model'
    '$PY' bench/overlap.py --workloads model --model '$overlap_model' \
      --device $overlap_device --batch 8,64 --output-tokens 32 --repeats 1
    rm -rf '$overlap_model'"
fi

# Every part in one process; gpu.json is rewritten after each part and engine shape,
# and the hf and engine parts start no new work once --wall-budget-s is used.
if want decode; then
  bench_limit=$(budget 330)
  bench=(bench/gpu_decode.py "${smoke[@]}" --json-out "$LOGS/gpu.json"
    --parts "${BENCH_PARTS:-kernels,parity,hf,engine}"
    --hf-budget-s 100 --engine-budget-s 130 --wall-budget-s $((bench_limit - 15)))
  run_step gpu_decode "$bench_limit" "$PY" "${bench[@]}"
fi

if ! want plot; then
  :
elif ! want decode || [[ ",${BENCH_PARTS:-hf}," != *,hf,* ]]; then
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
