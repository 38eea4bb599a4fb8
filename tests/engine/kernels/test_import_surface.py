"""The kernels, the triton backend and these tests import only torch/triton/numpy/pytest.

The GPU machine's image has nothing else (no gguf, tokenizers, web stack), so an
accidental import there would turn the whole GPU check into an import error.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.utils.python_child import run_python

REPO = Path(__file__).resolve().parents[3]
FORBIDDEN = [
    "gguf",
    "safetensors",
    "tokenizers",
    "transformers",
    "tqdm",
    "jinja2",
    "fastapi",
    "pydantic",
    "sqlalchemy",
    "redis",
    "httpx",
    "click",
    "tenancy",
    "gateway",
    "admin",
    "cloister",
    "prometheus_client",
    "opentelemetry",
]
MODULES = [
    "engine.attention.triton_backend",
    "engine.attention.torch_backend",
    "engine.kernels.kv_write",
    "engine.kernels.decode_attention",
    "engine.kernels.prefill_attention",
    "engine.kernels.fused_ops",
    "engine.kernels.fused_moe",
    "engine.model.moe",
    "tests.engine.kernels.batch_factory",
    "tests.utils.python_child",  # this test runs its probe through it
]

_PROBE = """
import importlib, importlib.abc, sys
forbidden = set(sys.argv[1].split())

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in forbidden:
            raise ImportError("forbidden on the GPU image: " + name)
        return None

sys.meta_path.insert(0, Block())
for module in sys.argv[2].split():
    importlib.import_module(module)
print("ok")
"""


def test_kernel_modules_need_only_the_gpu_image_packages() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = run_python(
        _PROBE, [" ".join(FORBIDDEN), " ".join(MODULES)], cwd=REPO, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
