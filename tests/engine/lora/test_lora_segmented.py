"""The segmented (batched over slots) LoRA path equals a per-row loop, and `build` picks it."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
import torch

from engine.config import ModelArchitecture
from engine.lora.batch import LoraBatch
from engine.lora.peft import AdapterWeights, module_shape, read_peft_adapter
from engine.lora.stacks import GROUPS, LoraStacks
from engine.model.hf_loader import architecture_from_config
from tests.utils.lora_engine import Adapters

CPU = torch.device("cpu")


def _stacks(
    adapters: Adapters, placed: dict[int, str]
) -> tuple[ModelArchitecture, LoraStacks, dict[int, AdapterWeights]]:
    arch = architecture_from_config(json.loads((adapters.model / "config.json").read_text()))
    stacks = LoraStacks(arch, max_loras=6, max_rank=16, dtype=torch.float32, device=CPU)
    weights = {s: read_peft_adapter(n, adapters.paths[n], arch, 16) for s, n in placed.items()}
    for slot, w in weights.items():
        stacks.load(slot, w)
    return arch, stacks, weights


def _expected_delta(
    arch: ModelArchitecture,
    weights: dict[int, AdapterWeights],
    slot: int | None,
    key: tuple[int, str],
    x: torch.Tensor,
) -> torch.Tensor:
    """One row's delta for packed projection `key` = (layer, group), computed directly."""
    layer, group = key
    parts = []
    for module in GROUPS[group]:
        pair = None if slot is None else weights[slot].modules.get((layer, module))
        if pair is None:
            parts.append(torch.zeros(module_shape(arch, module)[1]))
        else:
            parts.append(x @ pair[0].T @ pair[1].T)
    return torch.cat(parts)


# Adapters r4 (all projections), r8 (q, v only), r16 (MLP only), r8b (all).
CASES: dict[str, tuple[dict[int, str], list[int | None]]] = {
    "contiguous, base rows, repeats": (
        {0: "r4", 1: "r8", 2: "r8b"},
        [0, None, 2, 1, 0, None, 2, 2],
    ),
    "gathered slots (0 and 5)": ({0: "r4", 5: "r16"}, [5, None, 0, 5, 5, None, 0]),
    "no padding cell, one base row": ({0: "r4", 1: "r8", 2: "r16"}, [2, 0, None, 1]),
    "every row has an adapter, no padding": ({0: "r4", 1: "r8b"}, [1, 0, 0, 1]),
    "one slot, some base rows": ({3: "r8b"}, [None, 3, 3, None, 3]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_segmented_path_equals_a_per_row_loop(adapters: Adapters, case: str) -> None:
    placed, slots = CASES[case]
    arch, stacks, weights = _stacks(adapters, placed)
    batch = LoraBatch.build(stacks, slots, CPU, segmented=True)
    assert batch is not None and batch.segments is not None
    if case == "gathered slots (0 and 5)":
        assert batch.segments.slot_index is not None  # the index_select branch runs
    g = torch.Generator().manual_seed(3)
    for layer in range(arch.num_layers):
        for group, modules in GROUPS.items():
            fan_in = module_shape(arch, modules[0])[0]
            width = sum(module_shape(arch, m)[1] for m in modules)
            x = torch.randn(len(slots), fan_in, generator=g)
            y0 = torch.randn(len(slots), width, generator=g)
            y = batch.add(layer, group, x, y0.clone())
            grouped = LoraBatch.build(stacks, slots, CPU, segmented=False)
            assert grouped is not None and grouped.segments is None
            y_grouped = grouped.add(layer, group, x, y0.clone())
            for row, slot in enumerate(slots):
                expected = y0[row] + _expected_delta(arch, weights, slot, (layer, group), x[row])
                torch.testing.assert_close(y[row], expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(y, y_grouped, atol=1e-5, rtol=1e-5)


def test_build_picks_segmented_for_mixed_decode_and_grouped_otherwise(adapters: Adapters) -> None:
    _, stacks, _ = _stacks(adapters, {0: "r4", 1: "r8", 2: "r8b"})

    def segmented(rows: Sequence[int | None]) -> bool:
        batch = LoraBatch.build(stacks, rows, CPU)
        assert batch is not None
        return batch.segments is not None

    assert segmented([0, 1, 2, 0, None, 1, 2, 2])  # a decode batch mixing adapters
    assert not segmented([1] * 8)  # one adapter for the whole batch: one GEMM pair
    assert not segmented([None, 1, 1, None])  # one adapter: grouped (no loop to save)
    assert not segmented([0] * 64 + [1, 2])  # a long prefill: the grid would be mostly padding
    assert LoraBatch.build(stacks, [None, None], CPU) is None
