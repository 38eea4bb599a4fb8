"""A tiny model gives the same greedy tokens with the triton kernels and the torch reference.

On the CPU the kernels run in triton's interpreter (scripts/test sets TRITON_INTERPRET=1).
"""

from __future__ import annotations

import os
import pathlib

import pytest
import torch

from engine import LLM, SamplingParams

NO_TRITON = "triton needs CUDA or TRITON_INTERPRET=1 (scripts/test sets it)"
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip(reason=NO_TRITON, allow_module_level=True)

PROMPTS = ["Paged attention", "A prompt long enough to cover a few KV blocks of eight tokens each"]


def test_triton_matches_torch_reference(tiny_model: pathlib.Path) -> None:
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = {}
    for backend in ("torch", "triton"):
        # Small chunks make prefill run over a cached prefix; two prompts mix decode and prefill.
        llm = LLM(
            str(tiny_model),
            attention_backend=backend,
            block_size=8,
            num_blocks=64,
            prefill_chunk_size=8,
        )
        assert llm.engine.runner.backend.name == backend
        outs[backend] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    assert outs["triton"] == outs["torch"]
