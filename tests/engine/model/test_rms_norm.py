"""RMSNorm: torch's fused kernel where it is exact, the reference form elsewhere."""

from __future__ import annotations

import torch

from engine.model.norm import RMSNorm


def test_rms_norm_on_torchs_kernel_equals_the_reference_form() -> None:
    torch.manual_seed(8)
    norm = RMSNorm(64, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    x = torch.randn(7, 64) * 3
    x32 = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert torch.equal(norm(x), norm.weight * x32)
    xb = x.bfloat16()  # another dtype keeps the reference form
    ref = (
        norm.weight
        * (xb.float() * torch.rsqrt(xb.float().pow(2).mean(-1, keepdim=True) + 1e-5)).bfloat16()
    )
    assert torch.equal(norm(xb), ref)
