#!/usr/bin/env bash
# Builds .whl/ on THIS machine: the wheels scripts/gpu_check.sh installs on the GPU
# machine, which has Python 3.12, torch, triton, transformers, numpy and pytest but
# no network and no gguf. The engine imports gguf (GGUF loader; gguf itself needs
# pyyaml), safetensors and tqdm (loaders, LLM) at import time; gguf is always
# installed there, tqdm, safetensors and pyyaml only when the machine lacks them
# (transformers normally brings all three).
#
#   scripts/gpu_prepare.sh            # then the device tool's run call:
#   run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=580)
#
# .whl/ is ignored by git (.gitignore and .git/info/exclude) and travels only by carry.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mkdir -p .whl
download() {
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform any -d .whl "$@"
}
download gguf==0.19.0
download tqdm
download safetensors
download pyyaml
ls -l .whl
