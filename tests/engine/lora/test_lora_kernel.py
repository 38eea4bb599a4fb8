"""The triton BGMV kernel computes what the torch grouped path does (interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.lora_bgmv import bgmv_add_
from engine.request import EngineRequest
from tests.utils.lora_engine import GREEDY, Adapters, make_engine, outputs, run_all


def test_bgmv_matches_per_row_reference() -> None:
    g = torch.Generator().manual_seed(0)
    rank, n_in = 8, 40  # widths that are no multiple of the tiles: masks matter
    out_slices = ((0, 24), (24, 40), (40, 56))
    a = torch.randn(3, len(out_slices) * rank, n_in, generator=g)
    b = torch.randn(3, 56, rank, generator=g)
    slots = torch.tensor([0, -1, 2, 1, 0, -1, 2], dtype=torch.int32)
    x = torch.randn(len(slots), n_in, generator=g)
    y0 = torch.randn(len(slots), 56, generator=g)
    y = bgmv_add_(y0.clone(), x, slots, a, b, out_slices, rank)
    for row, slot in enumerate(slots.tolist()):
        expected = y0[row].clone()
        if slot >= 0:
            u = a[slot] @ x[row]
            for j, (start, end) in enumerate(out_slices):
                expected[start:end] += b[slot, start:end] @ u[j * rank : (j + 1) * rank]
        torch.testing.assert_close(y[row], expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_the_engine_on_the_kernel_matches_the_torch_path(adapters: Adapters) -> None:
    """A mixed batch (two adapters and the base) gives the same tokens on either path."""
    got: dict[str, list[list[int]]] = {}
    for kernel in ("torch", "triton"):
        engine = make_engine(adapters.model, lora_kernel=kernel)
        engine.load_adapter("r4", str(adapters.paths["r4"]))
        engine.load_adapter("r8", str(adapters.paths["r8"]))
        ids = [
            engine.add_request(
                EngineRequest(
                    prompt_token_ids=(7 + i, 300, 41, 9, 5 * i + 2),
                    params=GREEDY,
                    adapter=name,
                    cache=False,
                )
            )
            for i, name in enumerate(("r4", None, "r8"))
        ]
        run_all(engine)
        got[kernel] = [outputs(engine, rid) for rid in ids]
    assert got["triton"] == got["torch"]
