"""A fake fast model: the real engine, tokenizer and chat template, with a forward pass
that costs almost nothing, so that benchmarks of what surrounds the engine (the
gateway) measure that and not matrix multiplies.

The "model" keeps a random token table and answers every position with the logits
of its input token's row, so greedy output is deterministic and depends on the
prompt; KV blocks are allocated and freed by the engine as usual but never read.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import torch

from engine.engine_builder import build_config
from engine.fronts.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine
from engine.model.hf_loader import architecture_from_config
from engine.model.loader import LoadedModel
from engine.model.tokenizer import load_hf_tokenizer
from tests.utils.tiny_model import smollm2_tokenizer_dir, tiny_config

FAKE_VOCAB_ROWS = 64  # distinct next-token rows; input token t uses row t % 64


class FastFakeModel(torch.nn.Module):
    """forward() -> one small hidden row per position; compute_logits() -> vocab logits."""

    def __init__(self, vocab_size: int, seed: int = 0, *, compute_s: float = 0.0) -> None:
        """`compute_s`: seconds each forward pass waits with the GIL released, as a real
        model's kernels would run (0: none, the step is the engine's own work alone)."""
        super().__init__()
        self.compute_s = compute_s
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer(
            "logits_table", torch.randn(FAKE_VOCAB_ROWS, vocab_size, generator=gen)
        )

        self.fused_ops: Any = None

    def use_fused_ops(self, fused: Any) -> None:
        """Kept, like LlamaForCausalLM does; the fake has no norm, rotary or MLP to fuse."""
        self.fused_ops = fused

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The row index of each position (as the hidden state); the KV cache is untouched."""
        if self.compute_s:
            time.sleep(self.compute_s)
        return input_ids % FAKE_VOCAB_ROWS

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of each selected position's row."""
        table = self.logits_table
        assert isinstance(table, torch.Tensor)  # a registered buffer
        return table[hidden]


class GatedFakeModel(FastFakeModel):
    """The fake model, whose every forward pass waits for `gate` to be open.

    Closed, the engine stops inside its first step and its inbox fills: a test can
    build a backlog exactly, then open the gate and watch the order it drains in.
    """

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        super().__init__(vocab_size, seed)
        self.gate = threading.Event()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Waits for the gate (at most a minute, so a failing test cannot hang), then answers."""
        self.gate.wait(timeout=60)
        return super().forward(input_ids, positions, ctx)


def fast_fake_engine(**options: Any) -> AsyncEngine:
    """An AsyncEngine over `fast_fake_llm_engine(**options)`."""
    return AsyncEngine(fast_fake_llm_engine(**options))


# What the gateway tests' engine is built with, unless they say otherwise.
GATEWAY_ENGINE_OPTIONS: dict[str, Any] = {
    "max_model_len": 512,
    "num_blocks": 256,
    "attention_backend": "torch",
    "device": "cpu",
}


def gateway_test_engine(**options: Any) -> AsyncEngine:
    """The engine gateway tests run on: the real AsyncEngine over the fake fast model,
    with `GATEWAY_ENGINE_OPTIONS` (`options` override them). Scripted failures are
    patched onto it by tests/utils/engine_faults.py."""
    return fast_fake_engine(**{**GATEWAY_ENGINE_OPTIONS, **options})


def fast_fake_llm_engine(
    *, model: FastFakeModel | None = None, compute_s: float = 0.0, **options: Any
) -> LLMEngine:
    """An LLMEngine over the fake model, with the tiny model's shape and SmolLM2's tokenizer.

    No weights are written or loaded: the fake needs only a shape and a tokenizer.
    Module-level, so that `functools.partial(fast_fake_llm_engine, ...)` is a factory
    a `ProcessEngine` child can build.
    """
    folder = smollm2_tokenizer_dir()
    arch = architecture_from_config(tiny_config())
    fake = LoadedModel(
        model=model if model is not None else FastFakeModel(arch.vocab_size, compute_s=compute_s),  # type: ignore[arg-type]
        arch=arch,
        tokenizer=load_hf_tokenizer(folder),
        revision="fast-fake",
        name="fast-fake",
    )
    return LLMEngine(build_config(str(folder), **options), fake)


def fast_fake_settings(data_dir: Any, **overrides: Any) -> Any:
    """`cloister serve`'s settings for the fast fake engine on the CPU, with data under
    `data_dir`; `overrides` are further settings."""
    from server.settings import Settings  # the platform's own

    values: dict[str, Any] = {
        "data_dir": data_dir,
        "model_name": "fast-fake",
        "attention_backend": "torch",
        "device": "cpu",
        "max_model_len": 512,
        "kv_cache_bytes": 8 * 1024 * 1024,
    }
    return Settings(**{**values, **overrides})


def fast_fake_front(settings: Any, *, compute_s: float = 0.0) -> Any:
    """The engine front `cloister serve` would load for `settings` (its engine options,
    its engine mode), over the fake fast model; `compute_s` as in `fast_fake_llm_engine`."""
    from assembly.engine_options import serve_engine_options  # the platform's own
    from assembly.engines import load_engine

    options = serve_engine_options(settings)
    fake = functools.partial(fast_fake_llm_engine, compute_s=compute_s, **options)
    return load_engine(settings, factory=fake)
