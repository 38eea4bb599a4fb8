"""Runs the kernel tests on CUDA, or on the CPU through triton's interpreter.

Triton reads TRITON_INTERPRET when a kernel is decorated (`@triton.jit` at import of
the kernel module), so it must be set before `engine.kernels` is first imported.
`scripts/test` exports it for the whole suite; when this folder runs alone on a
machine without CUDA, this conftest sets it itself (it is imported before the test
modules). If the kernels were already compiled-mode objects by then (imported earlier
in the session without the variable) and there is no CUDA, the tests are skipped with
that reason rather than failing obscurely.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    os.environ["TRITON_INTERPRET"] = "1"

from engine.kernels import kv_write as _kv_write_module  # noqa: E402


def _skip_reason() -> str | None:
    """Why the kernels cannot run here, or None when they can."""
    interpreted = type(_kv_write_module._kv_write_kernel).__name__ == "InterpretedFunction"
    if torch.cuda.is_available() or interpreted:
        return None
    return (
        "no CUDA device and the triton kernels were imported before TRITON_INTERPRET=1 "
        "was set; run with TRITON_INTERPRET=1 in the environment (scripts/test does)"
    )


@pytest.fixture(autouse=True)
def _require_kernel_runtime() -> None:
    """Skips a kernel test only when neither CUDA nor the interpreter is usable."""
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
