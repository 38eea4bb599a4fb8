"""Decode-graph bookkeeping on the CPU: buckets, padding, static buffers, eager equality."""

from __future__ import annotations

import os

import pytest
import torch

from engine.attention.backend import AttentionBackend
from engine.attention.torch_backend import TorchAttentionBackend
from engine.model.forward_context import ForwardContext
from engine.runner.cuda_graphs import (
    PAD_SEQ_LEN,
    PAD_SLOT,
    DecodeGraphRunner,
    capture_sizes,
    pick_bucket,
)
from tests.engine.runner.factory import tiny_arch, tiny_model
from tests.utils.model_step import ModelStepper, contiguous_metadata

MAX_LEN = 48
BLOCK = 4


def test_capture_sizes_follow_the_ladder_and_end_at_max() -> None:
    assert capture_sizes(1) == (1,)
    assert capture_sizes(3) == (1, 2, 3)
    assert capture_sizes(8) == (1, 2, 4, 8)
    assert capture_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert capture_sizes(32) == (1, 2, 4, 8, 16, 24, 32)
    assert capture_sizes(256)[-3:] == (240, 248, 256)
    assert len(capture_sizes(256)) == 35
    with pytest.raises(ValueError):
        capture_sizes(0)


@pytest.mark.parametrize(
    ("n", "bucket"), [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 24), (32, 32), (33, None)]
)
def test_pick_bucket_is_the_next_size_up(n: int, bucket: int | None) -> None:
    assert pick_bucket(capture_sizes(32), n) == bucket


def _prefilled(backend: AttentionBackend, prompt_lens: list[int]) -> tuple[ModelStepper, list[int]]:
    """A stepper whose sequences hold seeded random prompts; returns it and next tokens."""
    arch = tiny_arch()
    model = tiny_model(arch, seed=3)
    stepper = ModelStepper(
        model, num_seqs=len(prompt_lens), max_len=MAX_LEN, block_size=BLOCK, backend=backend
    )
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(1, arch.vocab_size, (n,), generator=gen).tolist() for n in prompt_lens]
    logits = stepper.step(prompts)
    ends = torch.tensor(prompt_lens).cumsum(0) - 1
    return stepper, logits[ends].argmax(-1).tolist()


def _decode_step_inputs(
    stepper: ModelStepper, tokens: list[int]
) -> tuple[torch.Tensor, torch.Tensor, object]:
    meta = contiguous_metadata(
        [1] * len(tokens), stepper.lengths, block_size=BLOCK, blocks_per_seq=stepper.blocks_per_seq
    )
    return torch.tensor(tokens), torch.tensor(stepper.lengths), meta


def _runner(
    stepper: ModelStepper,
    backend: AttentionBackend,
    *,
    max_batch: int,
    kv_caches: list[torch.Tensor] | None = None,
    use_graphs: bool = False,
) -> DecodeGraphRunner:
    """A decode-graph runner on the CPU over `stepper`'s model (and by default its caches)."""
    return DecodeGraphRunner(
        stepper.model,
        backend,
        stepper.kv_caches if kv_caches is None else kv_caches,
        max_batch=max_batch,
        max_model_len=MAX_LEN,
        block_size=BLOCK,
        device=torch.device("cpu"),
        use_graphs=use_graphs,
    )


def _backend(name: str) -> AttentionBackend:
    if name == "torch":
        return TorchAttentionBackend()
    if os.environ.get("TRITON_INTERPRET") != "1":
        # These checks run on CPU tensors, which only the interpreter takes; compiled
        # kernels on a CUDA device are checked by test_cuda_device.py instead.
        pytest.skip(reason="CPU tensors need TRITON_INTERPRET=1; CUDA: test_cuda_device.py")
    from engine.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend()


@pytest.mark.parametrize(
    ("backend_name", "prompt_lens"),
    [
        ("torch", [5]),
        ("torch", [3, 9, 1]),
        ("torch", [7, 2, 13, 4, 6]),
        ("triton", [5]),
        ("triton", [3, 9, 1]),
    ],
)
def test_padded_static_path_equals_unpadded_eager(
    backend_name: str, prompt_lens: list[int]
) -> None:
    backend = _backend(backend_name)
    stepper, tokens = _prefilled(backend, prompt_lens)
    ids, positions, meta = _decode_step_inputs(stepper, tokens)
    eager_kv = [kv.clone() for kv in stepper.kv_caches]
    graph_kv = [kv.clone() for kv in stepper.kv_caches]

    with torch.inference_mode():
        ctx = ForwardContext(backend=backend, meta=meta, kv_caches=eager_kv)  # type: ignore[arg-type]
        expected = stepper.model(ids, positions, ctx)
        # use_graphs is ignored on the CPU: the same path runs eagerly.
        runner = _runner(stepper, backend, max_batch=8, kv_caches=graph_kv, use_graphs=True)
        runner.capture()
        assert runner.captured_sizes == ()
        assert runner.can_run(meta)  # type: ignore[arg-type]
        got = runner.run(ids, positions, meta)  # type: ignore[arg-type]

    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # Padding rows wrote nothing: both caches hold the same K/V (up to matmul rounding
    # from the different row count; a stray padding write would differ by O(1)).
    for a, b in zip(eager_kv, graph_kv, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_load_pads_rows_past_the_batch_and_clears_stale_ones() -> None:
    backend = TorchAttentionBackend()
    stepper, tokens = _prefilled(backend, [4, 6, 2, 8, 3])
    runner = _runner(stepper, backend, max_batch=8)
    ids, positions, meta = _decode_step_inputs(stepper, tokens)
    assert runner.load(ids, positions, meta) == 8  # type: ignore[arg-type]
    # A smaller batch next: rows 2.. must become padding again.
    ids2, pos2, meta2 = _decode_step_inputs(stepper, tokens)
    small = contiguous_metadata(
        [1, 1], stepper.lengths[:2], block_size=BLOCK, blocks_per_seq=stepper.blocks_per_seq
    )
    assert runner.load(ids2[:2], pos2[:2], small) == 2
    assert runner.input_ids[:2].tolist() == tokens[:2]
    assert runner.positions[:2].tolist() == stepper.lengths[:2]
    assert runner.slot_mapping[:2].tolist() == small.slot_mapping.tolist()
    assert runner.seq_lens[:2].tolist() == [n + 1 for n in stepper.lengths[:2]]
    width = small.block_tables.shape[1]
    assert torch.equal(runner.block_tables[:2, :width], small.block_tables)
    # Rows 2..7 still hold the 8-bucket load; only rows up to the bucket are ever read.
    assert runner.load(ids[:3], positions[:3], _first(meta, stepper, 3)) == 4
    assert runner.slot_mapping[3].item() == PAD_SLOT
    assert runner.seq_lens[3].item() == PAD_SEQ_LEN
    assert runner.input_ids[3].item() == 0
    assert not runner.block_tables[3].any()
    assert runner.block_tables.shape == (8, MAX_LEN // BLOCK)
    del meta2


def _first(meta: object, stepper: ModelStepper, n: int) -> object:
    return contiguous_metadata(
        [1] * n, stepper.lengths[:n], block_size=BLOCK, blocks_per_seq=stepper.blocks_per_seq
    )


def test_can_run_rejects_prefill_mixed_and_oversized_batches() -> None:
    backend = TorchAttentionBackend()
    stepper, _ = _prefilled(backend, [4, 4])
    runner = _runner(stepper, backend, max_batch=2)
    kw = {"block_size": BLOCK, "blocks_per_seq": stepper.blocks_per_seq}
    assert runner.can_run(contiguous_metadata([1, 1], [4, 4], **kw))
    assert not runner.can_run(contiguous_metadata([3], [0], **kw))  # prefill
    assert not runner.can_run(contiguous_metadata([1, 2], [4, 4], **kw))  # mixed
    assert not runner.can_run(contiguous_metadata([1, 1, 1], [4, 4, 4], **kw))  # > max
    with pytest.raises(ValueError):
        runner.load(
            torch.zeros(3, dtype=torch.long),
            torch.zeros(3, dtype=torch.long),
            contiguous_metadata([1, 1, 1], [4, 4, 4], **kw),
        )
