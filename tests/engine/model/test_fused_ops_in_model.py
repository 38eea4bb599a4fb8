"""The model on the fused triton kernels computes what the torch path computes.

`fused_ops="on"` routes every RMSNorm (+ the residual add before it), the rotary
embedding and SiLU-and-mul through engine/kernels/fused_ops.py. On the CPU the
kernels run in triton's interpreter (scripts/test sets TRITON_INTERPRET=1); on
CUDA (scripts/gpu_check.sh) the same tests run compiled, bf16 and CUDA graphs
included.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

from engine.config import ModelArchitecture
from engine.llm_engine import LLMEngine
from engine.model.decoder_layer import LlamaDecoderLayer
from engine.model.fused import (
    FusedOpsUnavailableError,
    kernels_interpreted,
    load_fused_ops,
    resolve_fused_ops,
)
from engine.model.hf_loader import architecture_from_config
from engine.model.llama import LlamaForCausalLM
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from tests.engine.runner.factory import tiny_arch, tiny_engine, tiny_model
from tests.utils.model_step import ModelStepper
from tests.utils.tiny_model import random_state_dict, tiny_config

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
NO_KERNELS = "the fused kernels need CUDA or TRITON_INTERPRET=1 (scripts/test sets it)"
needs_kernels = pytest.mark.skipif(
    not CUDA and os.environ.get("TRITON_INTERPRET") != "1", reason=NO_KERNELS
)
# Runs of the same fp32 math in a different order (kernel reductions vs torch's).
FP32_TOL = 1e-4
PROMPTS = [[5, 9, 200, 31, 7, 44, 3, 18, 90], [1, 2], [77, 12, 300, 41, 8]]


@pytest.fixture(autouse=True)
def _kernels_runnable() -> None:
    """A kernel import before TRITON_INTERPRET was set leaves compiled-mode kernels: a
    broken test set-up, reported as a failure rather than skipped as if it had passed."""
    if not CUDA and os.environ.get("TRITON_INTERPRET") == "1" and not kernels_interpreted():
        pytest.fail("the triton kernels were imported before TRITON_INTERPRET=1 was set")


def _loaded_model(arch: ModelArchitecture, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """Loaded like a checkpoint: q/k/v and gate/up packed (the serving layout)."""
    model = LlamaForCausalLM.empty(arch, dtype=dtype, device=DEVICE)
    model.load_weights((k, v.to(dtype)) for k, v in random_state_dict(arch, seed=5).items())
    return model


def _prefill_then_decode(model: LlamaForCausalLM, steps: int = 2) -> list[torch.Tensor]:
    """Logits of a mixed prefill (all prompt rows) and of `steps` greedy decode steps."""
    stepper = ModelStepper(model, num_seqs=len(PROMPTS), max_len=32)
    logits = [stepper.step(PROMPTS)]
    ends = torch.tensor([len(p) for p in PROMPTS], device=DEVICE).cumsum(0) - 1
    tokens = logits[0][ends].argmax(-1).tolist()
    for _ in range(steps):
        logits.append(stepper.step([[t] for t in tokens]))
        tokens = logits[-1].argmax(-1).tolist()
    return logits


@needs_kernels
@pytest.mark.parametrize("qwen2", [False, True], ids=["llama", "qwen2-bias"])
def test_fused_model_logits_match_the_torch_path(qwen2: bool) -> None:
    arch = architecture_from_config(tiny_config(qwen2=qwen2))
    model = _loaded_model(arch)
    with torch.inference_mode():
        reference = _prefill_then_decode(model)
        model.use_fused_ops(load_fused_ops())
        fused = _prefill_then_decode(model)
    assert len(fused) == len(reference) == 3
    for got, want in zip(fused, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=FP32_TOL, atol=FP32_TOL)
        # The same greedy choice, so the decode steps above fed both paths the same tokens.
        assert torch.equal(got.argmax(-1), want.argmax(-1))


@needs_kernels
def test_fused_path_is_not_the_torch_path() -> None:
    """The parity above means something: a broken kernel changes the logits."""
    arch = architecture_from_config(tiny_config())
    model = _loaded_model(arch)
    real = load_fused_ops()
    broken = type(real)(
        add_rms_norm=real.add_rms_norm,
        rotary_=lambda q, k, pos, cos, sin: None,  # skips the rotation
        silu_and_mul=real.silu_and_mul,
    )
    with torch.inference_mode():
        reference = _prefill_then_decode(model, steps=0)[0]
        model.use_fused_ops(broken)
        wrong = _prefill_then_decode(model, steps=0)[0]
    assert not torch.allclose(wrong, reference, rtol=FP32_TOL, atol=FP32_TOL)


@needs_kernels
def test_every_fused_kernel_runs_in_every_layer() -> None:
    arch = architecture_from_config(tiny_config(num_layers=3))
    model = _loaded_model(arch)
    real = load_fused_ops()
    calls: collections.Counter[str] = collections.Counter()

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            calls[name] += 1
            return fn(*args)

        return wrapper

    model.use_fused_ops(
        type(real)(
            add_rms_norm=counted("norm", real.add_rms_norm),
            rotary_=counted("rotary", real.rotary_),
            silu_and_mul=counted("silu", real.silu_and_mul),
        )
    )
    with torch.inference_mode():
        _prefill_then_decode(model, steps=0)
    # Two norms per layer (each with the residual add before it) and the final one.
    assert calls == {"norm": 2 * 3 + 1, "rotary": 3, "silu": 3}


@needs_kernels
def test_unpacked_projections_take_the_fused_path_too() -> None:
    """A model built by its constructor (q/k/v and gate/up not packed) gives the same logits."""
    arch = architecture_from_config(tiny_config(qwen2=True))
    model = LlamaForCausalLM(arch).to(DEVICE).eval().requires_grad_(False)
    model.load_state_dict(random_state_dict(arch, seed=2), strict=False)
    layer = model.model.layers[0]
    assert isinstance(layer, LlamaDecoderLayer) and layer.self_attn.qkv_weight is None
    with torch.inference_mode():
        reference = _prefill_then_decode(model, steps=1)
        model.use_fused_ops(load_fused_ops())
        fused = _prefill_then_decode(model, steps=1)
    for got, want in zip(fused, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=FP32_TOL, atol=FP32_TOL)


def _engine_outputs(
    mode: str, dtype: torch.dtype
) -> tuple[LLMEngine, list[tuple[int, ...]], list[list[float]]]:
    """Greedy tokens and their logprobs through LLMEngine (scheduler, ModelRunner, sampler)."""
    arch = tiny_arch()
    engine = tiny_engine(
        arch,
        tiny_model(arch, seed=1, dtype=dtype).to(DEVICE),
        device=str(DEVICE),
        dtype=dtype,
        fused_ops=mode,
        block_size=4,
        num_blocks=64,
        prefill_chunk_size=4,  # chunked prefill over a cached prefix, mixed with decode
        max_num_seqs=4,
    )
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=0)
    ids = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(p), params=params)) for p in PROMPTS
    ]
    while engine.has_unfinished():
        engine.step()
    outs = [engine.finished.pop(i).to_output().outputs[0] for i in ids]
    tokens = [tuple(o.token_ids) for o in outs]
    logprobs = [[p.chosen.logprob for p in o.logprobs or ()] for o in outs]
    return engine, tokens, logprobs


@needs_kernels
def test_engine_with_fused_ops_on_gives_the_same_greedy_tokens_and_logprobs() -> None:
    off, ref_tokens, ref_lps = _engine_outputs("off", torch.float32)
    on, tokens, lps = _engine_outputs("on", torch.float32)
    assert off.loaded.model.fused_ops is None
    assert on.loaded.model.fused_ops is not None
    assert tokens == ref_tokens
    assert all(len(t) == 5 for t in tokens) and len(set(tokens)) > 1
    torch.testing.assert_close(torch.tensor(lps), torch.tensor(ref_lps), rtol=0, atol=FP32_TOL)
    if CUDA:  # decode steps replayed a graph captured with the fused kernels in it
        assert on.runner.graphs is not None and on.runner.graphs.captured_sizes


@pytest.mark.skipif(not CUDA, reason="bf16 kernels need CUDA (numpy has no bfloat16)")
def test_bf16_fused_engine_on_cuda_agrees_with_the_torch_path() -> None:
    _, ref_tokens, _ = _engine_outputs("off", torch.bfloat16)
    on, tokens, _ = _engine_outputs("auto", torch.bfloat16)  # auto is on, on CUDA
    assert on.loaded.model.fused_ops is not None
    # bf16 rounding in another order may flip a near-tie late on; the first steps agree.
    assert [t[:3] for t in tokens] == [t[:3] for t in ref_tokens]


def test_resolution_of_the_fused_ops_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_fused_ops("off", cuda) is False
    assert resolve_fused_ops("auto", cpu) is False  # the CPU default is the torch path
    monkeypatch.setattr("engine.model.fused.triton_importable", lambda: True)
    assert resolve_fused_ops("auto", cuda) is True
    assert resolve_fused_ops("on", cuda) is True
    monkeypatch.setattr("engine.model.fused.triton_importable", lambda: False)
    assert resolve_fused_ops("auto", cuda) is False
    with pytest.raises(FusedOpsUnavailableError, match="triton is not installed"):
        resolve_fused_ops("on", cuda)


def test_on_is_refused_on_the_cpu_without_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(FusedOpsUnavailableError, match="need CUDA"):
        resolve_fused_ops("on", torch.device("cpu"))
    arch = tiny_arch()
    with pytest.raises(FusedOpsUnavailableError):
        tiny_engine(arch, tiny_model(arch), device="cpu", fused_ops="on", num_blocks=16)


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(FusedOpsUnavailableError, match="auto, on or off"):
        resolve_fused_ops("fast", torch.device("cpu"))  # type: ignore[arg-type]
