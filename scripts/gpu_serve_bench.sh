#!/usr/bin/env bash
# `cloister serve` on random weights in a real shape, then one short serving benchmark.
# A step of scripts/gpu_check.sh (which installs the carried wheels first); it runs
# alone as well:  LOGS=/tmp/x PYTHON=python3 bash scripts/gpu_serve_bench.sh
#
#   1. bench/serve_model.py writes an HF folder: seeded random bf16 weights in the
#      SERVE_SHAPE (default smollm2-135m; llama-1b: Llama-3.2-1B's layers), SmolLM2's
#      tokenizer from $ASSETS/tokenizer (made by scripts/gpu_prepare.sh);
#   2. a tenant and a key in a fresh data folder (SQLite), then `cloister serve` with
#      no engine flag at all, so what it runs is what it picks for the machine; the
#      engine's "engine path:" log line (device, dtype, attention, fused ops, CUDA
#      graphs) is kept in $LOGS/serve_path.txt;
#   3. SGLang's bench_serving client ($ASSETS/sgl, extracted from the sglang wheel by
#      scripts/gpu_prepare.sh) when it imports here, then bench/serve_load.py (stdlib,
#      token counts from the server's usage), each on random-id prompts
#      (SERVE_INPUT_LEN / SERVE_OUTPUT_LEN tokens, SERVE_PROMPTS requests,
#      SERVE_CONCURRENCY at once), greedy. The gateway does not honour ignore_eos, so
#      an output may end early at an EOS (serve_load.json shows the real count);
#      SERVE_EOS_BIAS=1 biases the EOS ids away, at the price of the sampler's slower
#      logit-bias path.
# Figures: $LOGS/serve_bench.json (SGLang's result line), $LOGS/serve_load.json (ours).
# Exit status 0 only when the server started and every client run completed.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
LOGS=${LOGS:?set LOGS to the folder for logs and figures}
ASSETS=${ASSETS:-var/gpu}
SHAPE=${SERVE_SHAPE:-smollm2-135m}
PORT=${SERVE_PORT:-8123}
READY_S=${SERVE_READY_S:-180}
WORK=$(mktemp -d /tmp/gpu_serve.XXXXXX)
export PYTHONPATH=$PWD:$PWD/platform${PYTHONPATH:+:$PYTHONPATH}
export CLOISTER_DATA_DIR=$WORK/data HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
unset CLOISTER_DATABASE_URL CLOISTER_REDIS_URL
CLI=("$PY" -c "from cloister.cli import main; main()")
server_pid=""

stop_server() {  # only the process this script started
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"
    for _ in $(seq 30); do kill -0 "$server_pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$server_pid" 2>/dev/null && kill -KILL "$server_pid"
  fi
  rm -rf "$WORK"
}
trap stop_server EXIT

fail() { echo "serve_bench: $*" | tee -a "$LOGS/serve_path.txt"; exit 1; }

# 1. The model folder.
[ -f "$ASSETS/tokenizer/tokenizer.json" ] || fail "no $ASSETS/tokenizer (run scripts/gpu_prepare.sh, carry $ASSETS)"
"$PY" bench/serve_model.py --shape "$SHAPE" --tokenizer "$ASSETS/tokenizer" --out "$WORK/model" \
  || fail "could not write the model folder"

# 2. A key, then the server.
"${CLI[@]}" tenants create bench >/dev/null || fail "tenants create failed"
KEY=$("${CLI[@]}" keys create --tenant bench --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["key"])') \
  || fail "keys create failed"
"${CLI[@]}" serve --model "$WORK/model" --model-name bench --host 127.0.0.1 --port "$PORT" \
  ${SERVE_FLAGS:-} >"$LOGS/serve.log" 2>&1 &
server_pid=$!
echo "$server_pid" >"$LOGS/serve.pid"
t0=$SECONDS
until "$PY" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; do
  kill -0 "$server_pid" 2>/dev/null || { tail -n 40 "$LOGS/serve.log"; fail "cloister serve exited"; }
  ((SECONDS - t0 < READY_S)) || { tail -n 40 "$LOGS/serve.log"; fail "not ready in ${READY_S}s"; }
  sleep 1
done
echo "ready in $((SECONDS - t0))s (shape $SHAPE)" | tee "$LOGS/serve_path.txt"
grep -o 'engine path: [^"]*' "$LOGS/serve.log" | tee -a "$LOGS/serve_path.txt"

# 3. The benchmark: a warm-up, SGLang's client when it imports here, then ours (whose
#    token counts come from the server's usage, so outputs cut short by an EOS show).
IN=${SERVE_INPUT_LEN:-256} OUTLEN=${SERVE_OUTPUT_LEN:-128}
N=${SERVE_PROMPTS:-64} C=${SERVE_CONCURRENCY:-16}
base=http://127.0.0.1:$PORT
bias=()
extra='{}'
if [ -n "${SERVE_EOS_BIAS:-}" ]; then  # off by default: a logit_bias leaves the greedy fast path
  bias=(--eos-bias)
  extra='{"logit_bias": {"0": -100, "2": -100}}'
fi
"$PY" bench/serve_load.py --base-url "$base" --model bench --api-key "$KEY" \
  --num-prompts 4 --concurrency 4 --input-len 32 --output-len 8 >"$LOGS/serve_warmup.json" \
  || fail "warm-up requests failed: $(cat "$LOGS/serve_warmup.json")"

rm -f "$LOGS/serve_bench.json" "$LOGS/serve_load.json"
rc=0
SGL_PATH=$ASSETS/sgl:/tmp/site-client  # gpu_check.sh installs the client's wheels there
if ! "$PY" -c "import datasets" 2>/dev/null; then
  SGL_PATH=$SGL_PATH:$ASSETS/sgl-stubs  # HF datasets: imported by the client, unused here
fi
if [ -d "$ASSETS/sgl/sglang" ] && PYTHONPATH=$SGL_PATH:$PYTHONPATH "$PY" -c "import sglang.benchmark.serving" 2>"$LOGS/sglang_import.log"; then
  echo "client: SGLang bench_serving ($ASSETS/sgl) -> serve_bench.json" | tee -a "$LOGS/serve_path.txt"
  OPENAI_API_KEY=$KEY PYTHONPATH=$SGL_PATH:$PYTHONPATH "$PY" -m sglang.benchmark.serving \
    --backend vllm --base-url "$base" --model bench --tokenizer "$ASSETS/tokenizer" \
    --dataset-name random-ids --random-input-len "$IN" --random-output-len "$OUTLEN" \
    --random-range-ratio 1.0 --num-prompts "$N" --max-concurrency "$C" \
    --extra-request-body "$extra" --output-file "$WORK/sglang.jsonl" >"$LOGS/bench_serving.log" 2>&1
  sgl_rc=$?
  tail -n 40 "$LOGS/bench_serving.log"
  if [ "$sgl_rc" -eq 0 ] && [ -s "$WORK/sglang.jsonl" ]; then
    tail -n 1 "$WORK/sglang.jsonl" >"$LOGS/serve_bench.json"
  else
    rc=2
  fi
  echo "SGLang bench_serving rc=$sgl_rc" | tee -a "$LOGS/serve_path.txt"
else
  echo "client: SGLang bench_serving absent or not importable: $(tail -n 1 "$LOGS/sglang_import.log" 2>/dev/null)" \
    | tee -a "$LOGS/serve_path.txt"
fi
echo "client: bench/serve_load.py -> serve_load.json" | tee -a "$LOGS/serve_path.txt"
"$PY" bench/serve_load.py --base-url "$base" --model bench --api-key "$KEY" --num-prompts "$N" \
  --concurrency "$C" --input-len "$IN" --output-len "$OUTLEN" "${bias[@]}" \
  --json-out "$LOGS/serve_load.json" || rc=1
echo "benchmark rc=$rc" | tee -a "$LOGS/serve_path.txt"
exit "$rc"
