"""Rotary embeddings: scaling variants and the rotation itself."""

from __future__ import annotations

import pytest
import torch

from engine.errors import UnsupportedModelError
from engine.model.rope import RotaryEmbedding, compute_inv_freq


def test_default_inv_freq_follows_theta() -> None:
    inv = compute_inv_freq(8, 10000.0)
    expected = torch.tensor([1.0, 10000.0**-0.25, 10000.0**-0.5, 10000.0**-0.75])
    torch.testing.assert_close(inv, expected)


def test_linear_scaling_equals_dividing_positions() -> None:
    scaled = RotaryEmbedding(16, 64, 10000.0, {"rope_type": "linear", "factor": 4.0})
    plain = RotaryEmbedding(16, 64, 10000.0)
    q, k = torch.randn(3, 2, 16), torch.randn(3, 1, 16)
    qs, ks = scaled(torch.tensor([0, 8, 40]), q, k)
    qp, kp = plain(torch.tensor([0, 2, 10]), q, k)
    torch.testing.assert_close(qs, qp)
    torch.testing.assert_close(ks, kp)


def test_llama3_keeps_high_and_slows_low_frequencies() -> None:
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    base = compute_inv_freq(128, 500000.0)
    scaled = compute_inv_freq(128, 500000.0, scaling)
    assert scaled[0] == base[0]  # shortest wavelength untouched
    torch.testing.assert_close(scaled[-1], base[-1] / 8.0)  # longest slowed by factor
    assert bool((scaled <= base).all())


def test_legacy_type_key_is_understood() -> None:
    a = compute_inv_freq(8, 100.0, {"type": "linear", "factor": 2.0})
    torch.testing.assert_close(a, compute_inv_freq(8, 100.0) / 2.0)


def test_unsupported_scaling_is_refused() -> None:
    with pytest.raises(UnsupportedModelError, match="yarn"):
        compute_inv_freq(8, 10000.0, {"rope_type": "yarn", "factor": 4.0})


def test_rotation_preserves_norms_and_position_zero_is_identity() -> None:
    rope = RotaryEmbedding(32, 128, 10000.0)
    q, k = torch.randn(4, 3, 32), torch.randn(4, 1, 32)
    positions = torch.tensor([0, 5, 77, 127])
    qr, kr = rope(positions, q, k)
    torch.testing.assert_close(qr.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(qr[0], q[0])
    torch.testing.assert_close(kr[0], k[0])
    assert not torch.allclose(qr[1], q[1])


def test_relative_positions_only_matter() -> None:
    rope = RotaryEmbedding(16, 256, 10000.0)
    q, k = torch.randn(1, 1, 16), torch.randn(1, 1, 16)
    q1, _ = rope(torch.tensor([10]), q, k)
    _, k1 = rope(torch.tensor([3]), q, k)
    q2, _ = rope(torch.tensor([110]), q, k)
    _, k2 = rope(torch.tensor([103]), q, k)
    torch.testing.assert_close((q1 * k1).sum(), (q2 * k2).sum(), atol=1e-4, rtol=1e-4)


def test_freq_factors_divide_frequencies() -> None:
    factors = torch.tensor([1.0, 2.0, 4.0, 8.0])
    rope = RotaryEmbedding(8, 16, 10000.0, freq_factors=factors)
    expected = torch.outer(torch.arange(16.0), compute_inv_freq(8, 10000.0) / factors)
    torch.testing.assert_close(rope.cos_cache, expected.cos())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotation_equals_the_textbook_form_bit_for_bit(dtype: torch.dtype) -> None:
    # The one-table form must not move a single bit: the model's outputs are pinned by
    # parity tests against the reference, and greedy decoding flips on near-ties.
    torch.manual_seed(7)
    rope = RotaryEmbedding(head_dim=64, max_positions=512, theta=10000.0)
    positions = torch.randint(0, 512, (6,))
    q = torch.randn(6, 9, 64).to(dtype)
    k = torch.randn(6, 3, 64).to(dtype)
    cos = rope.cos_cache[positions].unsqueeze(1)
    sin = rope.sin_cache[positions].unsqueeze(1)

    def textbook(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float()[..., :32], x.float()[..., 32:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).to(dtype)

    rq, rk = rope(positions, q, k)
    assert rq.dtype == dtype and torch.equal(rq, textbook(q))
    assert torch.equal(rk, textbook(k))
