"""The decode graphs and the memory profile on a real CUDA device (skipped without one).

scripts/gpu_check.sh runs these on the GPU machine; on the CPU the same bookkeeping
is covered by test_cuda_graphs.py and test_memory.py.
"""

from __future__ import annotations

import pytest
import torch

from engine.attention.triton_backend import TritonAttentionBackend
from engine.model.forward_context import ForwardContext
from engine.runner.cuda_graphs import DecodeGraphRunner, pick_bucket
from engine.runner.memory import kv_cache_budget, profile_memory
from tests.engine.runner.factory import tiny_arch, tiny_model
from tests.utils.model_step import ModelStepper, contiguous_metadata

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

MAX_LEN = 1100  # > 2 x 512: the split-K decode path is fixed at capture
BLOCK = 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_equals_eager_for_every_batch_size(dtype: torch.dtype) -> None:
    device = torch.device("cuda")
    backend = TritonAttentionBackend()
    # Positions reach MAX_LEN - 1: past the rope table, CUDA would assert in the gather.
    arch = tiny_arch(head_dim=64, max_positions=MAX_LEN)
    model = tiny_model(arch, seed=5).to(dtype=dtype, device=device)
    model.rotary.rebuild(device)  # keep the rope tables in float32
    lens = [37, 5, 700, 129, 64, 1, 300, 17, 1000]
    stepper = ModelStepper(
        model, num_seqs=len(lens), max_len=MAX_LEN, block_size=BLOCK, backend=backend
    )
    gen = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        stepper.step(
            [torch.randint(1, arch.vocab_size, (n,), generator=gen).tolist() for n in lens]
        )
        runner = DecodeGraphRunner(
            model,
            backend,
            stepper.kv_caches,
            max_batch=16,
            max_model_len=MAX_LEN,
            block_size=BLOCK,
            device=device,
            use_graphs=True,
        )
        runner.capture()
        assert runner.captured_sizes == (1, 2, 4, 8, 16)
        for n in (1, 3, 9):
            meta = contiguous_metadata(
                [1] * n,
                stepper.lengths[:n],
                block_size=BLOCK,
                blocks_per_seq=stepper.blocks_per_seq,
                device=device,
            )
            ids = torch.randint(1, arch.vocab_size, (n,), device=device)
            positions = torch.tensor(stepper.lengths[:n], device=device)
            eager_kv = [kv.clone() for kv in stepper.kv_caches]
            ctx = ForwardContext(backend=backend, meta=meta, kv_caches=eager_kv)
            expected = model(ids, positions, ctx)
            got = runner.run(ids, positions, meta).clone()
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
            for a, b in zip(eager_kv, stepper.kv_caches, strict=True):
                torch.testing.assert_close(a, b, rtol=tol, atol=tol)
            # A bare replay on the same buffers repeats the step exactly.
            bucket = pick_bucket(runner.sizes, n)
            assert bucket is not None
            assert torch.equal(runner.replay(bucket)[:n], got)


def test_memory_profile_sees_the_weights_and_a_positive_peak() -> None:
    device = torch.device("cuda")
    arch = tiny_arch(num_layers=4, head_dim=64, max_positions=1024)  # the profile's max_model_len
    model = tiny_model(arch).to(device)
    model.rotary.rebuild(device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    profile = profile_memory(
        model,
        arch,
        TritonAttentionBackend(),
        max_num_batched_tokens=4096,
        max_num_seqs=64,
        max_model_len=1024,
        block_size=BLOCK,
        dtype=torch.float32,
        device=device,
    )
    assert profile.weights_bytes >= weights
    # At least the logits of 64 rows (float32) were live at the peak.
    assert profile.activation_peak_bytes >= 64 * arch.vocab_size * 4
    total = torch.cuda.get_device_properties(device).total_memory
    assert abs(profile.total_bytes - total) <= total // 100
    assert kv_cache_budget(profile, 0.9) > 0
