#!/usr/bin/env bash
# Builds, on THIS machine, what scripts/gpu_check.sh needs on the GPU machine, which
# has Python 3.12, torch, triton, transformers, numpy and pytest but no network:
#
#   .whl/*.whl        gguf (always installed there), tqdm, safetensors, pyyaml (only
#                     where missing): the engine imports them at import time;
#   .whl/web/*.whl    the service's stack for `cloister serve` (fastapi, uvicorn,
#                     pydantic, sqlalchemy, alembic, ...), pinned to the versions of
#                     the environment that runs this script (the one the tests use);
#   .whl/client/*.whl what SGLang's bench_serving client imports (aiohttp, orjson, ...);
#   var/gpu/tokenizer SmolLM2's tokenizer as HF files (from the bundled GGUF);
#   var/gpu/sgl       SGLang's benchmark client: from /tmp/peers/sgl when
#                     /work/shared/tools/peers-setup built it, else taken from the
#                     sglang wheel the same way (two heavy imports stubbed);
#   var/gpu/sgl-stubs a stand-in for HF datasets, which that client imports but the
#                     random datasets never use.
# On the GPU machine each wheel is installed only when its distribution is missing.
#
#   PYTHON=.venv/bin/python scripts/gpu_prepare.sh     # then the device tool's run call:
#   run(command="bash scripts/gpu_check.sh", carry=[".whl", "var/gpu"], timeout_s=580)
#
# .whl/ and var/ are ignored by git and travel only by carry (64 MiB in all; this
# script prints the total).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
mkdir -p .whl/web .whl/client var/gpu
download() {  # folder, then requirements
  local dest=$1
  shift
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform any -d "$dest" "$@"
}
pinned() {  # each distribution at this environment's version, unpinned when absent
  "$PY" - "$@" <<'PY'
import importlib.metadata as md, sys
for name in sys.argv[1:]:
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(name)
PY
}

download .whl gguf==0.19.0 tqdm safetensors pyyaml

# What `cloister serve` imports (engine aside), with every dependency named: --no-deps
# keeps the set exact and the versions those of the tested environment.
WEB=(fastapi starlette annotated-doc pydantic pydantic-core pydantic-settings python-dotenv
  typing-inspection annotated-types typing-extensions uvicorn h11 uvloop httptools anyio
  sniffio click sqlalchemy greenlet alembic mako markupsafe jinja2 cryptography cffi pycparser
  opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions prometheus-client
  redis hiredis psutil httpx httpcore certifi idna)
mapfile -t reqs < <(pinned "${WEB[@]}")
download .whl/web "${reqs[@]}"

CLIENT=(aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl orjson
  requests urllib3 charset-normalizer pybase64 msgspec pillow)
mapfile -t reqs < <(pinned "${CLIENT[@]}")
download .whl/client "${reqs[@]}"

if [ ! -f var/gpu/tokenizer/tokenizer.json ]; then
  PYTHONPATH=$PWD "$PY" - <<'PY'
import shutil
from pathlib import Path

from tests.utils.tiny_model import smollm2_tokenizer_dir

dest = Path("var/gpu/tokenizer")
dest.mkdir(parents=True, exist_ok=True)
for item in smollm2_tokenizer_dir().iterdir():
    shutil.copy(item, dest / item.name)
PY
fi

if [ ! -d var/gpu/sgl/sglang/benchmark ]; then
  if [ -d /tmp/peers/sgl/sglang/benchmark ]; then
    mkdir -p var/gpu/sgl && cp -r /tmp/peers/sgl/sglang var/gpu/sgl/
  else  # the same extraction as /work/shared/tools/peers-setup
    tmp=$(mktemp -d)
    "$PY" -m pip download -q --no-deps "sglang==$SGLANG_VERSION" -d "$tmp"
    "$PY" - "$tmp" <<'PY'
import glob, sys, zipfile
z = zipfile.ZipFile(glob.glob(sys.argv[1] + "/sglang-*.whl")[0])
for n in z.namelist():
    if n.startswith("sglang/benchmark/") or n == "sglang/bench_serving.py":
        z.extract(n, "var/gpu/sgl")
PY
    rm -rf "$tmp"
    s=var/gpu/sgl/sglang
    mkdir -p $s/srt/disaggregation $s/srt/utils
    touch $s/__init__.py $s/srt/__init__.py $s/srt/disaggregation/__init__.py $s/srt/utils/__init__.py
    echo 'FAKE_BOOTSTRAP_HOST = "2.2.2.2"' >$s/srt/disaggregation/utils.py
    printf 'def resolve_base_url(base_url, host, port):\n    return base_url or f"http://{host}:{port}"\ndef resolve_host_port(base_url, host, port):\n    return base_url or f"{host}:{port}"\n' >$s/srt/utils/network.py
  fi
  find var/gpu/sgl -name __pycache__ -prune -exec rm -rf {} +
fi
# The client imports HF `datasets` at import time (mmmu.py) but never calls it for the
# random datasets; pyarrow alone would not fit the carry, so where the GPU machine has
# no `datasets`, gpu_serve_bench.sh puts this stub on the client's path.
mkdir -p var/gpu/sgl-stubs/datasets
cat >var/gpu/sgl-stubs/datasets/__init__.py <<'PY'
"""Stand-in for HF datasets: SGLang's benchmark imports it; the random datasets never call it."""


def load_dataset(*args, **kwargs):
    raise NotImplementedError("HF datasets is not installed here (a stub from gpu_prepare.sh)")
PY

du -sh .whl .whl/web .whl/client var/gpu/tokenizer var/gpu/sgl
echo "carry total: $(du -scm .whl var/gpu | tail -n 1 | cut -f1) MiB (the limit is 64)"
