"""What a mixture-of-experts model refuses, by name: LoRA adapters and weight-only
quantization (neither has an expert path yet)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.errors import InvalidAdapterError, UnsupportedModelError
from engine.model.loader import load_model
from tests.utils.hf_families import make_family_dir
from tests.utils.lora_adapters import make_peft_adapter


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_family_dir(tmp_path_factory.mktemp("moe"), "mixtral", seed=4)


def test_a_lora_adapter_is_refused_and_the_model_still_serves(
    mixtral_dir: Path, tmp_path: Path
) -> None:
    import torch

    arch = load_model(str(mixtral_dir), dtype=torch.float32, device="cpu").arch
    # An adapter of the attention projections only: shapes the dense decoder would take.
    adapter = make_peft_adapter(tmp_path / "a", arch, rank=4, alpha=8, targets=["q_proj"])
    llm = LLM(str(mixtral_dir), max_model_len=128, kv_cache_bytes=4 * 2**20, block_size=4)
    with pytest.raises(InvalidAdapterError, match="mixture-of-experts models \\(mixtral\\)"):
        llm.engine.load_adapter("a", str(adapter))
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3


def test_weight_quant_is_refused_by_name(mixtral_dir: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="weight_quant is not supported on mixture"):
        LLM(str(mixtral_dir), max_model_len=64, kv_cache_bytes=2**20, weight_quant="int8")
