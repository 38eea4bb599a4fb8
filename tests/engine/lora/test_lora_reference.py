"""An adapter served by the engine computes what the merged model (W + scale * B @ A) does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.lora.batch import LoraBatch
from engine.lora.peft import read_peft_adapter
from engine.lora.stacks import LoraStacks
from engine.model.hf_loader import architecture_from_config
from engine.request import EngineRequest
from tests.utils.lora_adapters import merge_adapter
from tests.utils.lora_engine import GREEDY, Adapters, make_engine, outputs, record_logits, run_all

PROMPT = [5, 17, 301, 44, 9, 1200, 77, 3, 18, 250, 61]


def _generate(model: Path, adapter: tuple[str, Path] | None) -> tuple[list[int], torch.Tensor]:
    engine = make_engine(model, prefill_chunk_size=4)  # chunked prefill: several steps
    log: list[torch.Tensor] = []
    record_logits(engine, log)
    name = None
    if adapter is not None:
        name = adapter[0]
        engine.load_adapter(name, str(adapter[1]))
    rid = engine.add_request(
        EngineRequest(prompt_token_ids=tuple(PROMPT), params=GREEDY, adapter=name)
    )
    run_all(engine)
    return outputs(engine, rid), torch.cat(log)


@pytest.mark.parametrize("name", ["r4", "r8", "r16"])
def test_adapter_equals_the_merged_model(adapters: Adapters, tmp_path: Path, name: str) -> None:
    merged = merge_adapter(adapters.model, adapters.paths[name], tmp_path / "merged")
    ref_tokens, ref_logits = _generate(merged, None)
    tokens, logits = _generate(adapters.model, (name, adapters.paths[name]))
    base_tokens, base_logits = _generate(adapters.model, None)
    assert tokens == ref_tokens
    assert (logits - ref_logits).abs().max().item() < 1e-3
    # The adapter matters: the base model's logits are far from the merged ones.
    assert (base_logits - ref_logits).abs().max().item() > 1e-1


def test_grouped_matmul_equals_a_per_row_loop(adapters: Adapters) -> None:
    """Rows of three slots and the base, interleaved: each row gets only its own delta."""
    import json

    arch = architecture_from_config(json.loads((adapters.model / "config.json").read_text()))
    stacks = LoraStacks(
        arch, max_loras=3, max_rank=16, dtype=torch.float32, device=torch.device("cpu")
    )
    weights = [read_peft_adapter(n, adapters.paths[n], arch, 16) for n in ("r4", "r8", "r8b")]
    for index, w in enumerate(weights):
        stacks.load(index, w)
    slots = [0, None, 2, 1, 0, None, 2, 2]
    x = torch.randn(len(slots), arch.hidden_size, generator=torch.Generator().manual_seed(0))
    out_q = arch.num_heads * arch.head_dim
    out_kv = arch.num_kv_heads * arch.head_dim
    y = torch.zeros(len(slots), out_q + 2 * out_kv)
    batch = LoraBatch.build(stacks, slots, torch.device("cpu"))
    assert batch is not None
    batch.add(1, "qkv", x, y)
    for row, slot in enumerate(slots):
        expected = []
        for module in ("q_proj", "k_proj", "v_proj"):
            out = out_q if module == "q_proj" else out_kv
            pair = None if slot is None else weights[slot].modules.get((1, module))
            expected.append(torch.zeros(out) if pair is None else x[row] @ pair[0].T @ pair[1].T)
        torch.testing.assert_close(y[row], torch.cat(expected), atol=1e-5, rtol=1e-5)
