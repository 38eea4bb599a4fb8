"""The allowed-token masks of one step's structured rows, and their application to logits.

One int32 bitmask row per structured row (llguidance's layout: bit j of word w
allows token 32 w + j), filled on the host and applied to the whole batch's
logits in one masked fill on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenMask:
    """`bitmask[k]` lists the tokens allowed to batch row `rows[k]`; other rows are free."""

    rows: tuple[int, ...]
    bitmask: torch.Tensor  # [len(rows), ceil(V / 32)] int32, on the host


def mask_words(vocab_size: int) -> int:
    """32-bit words per bitmask row."""
    return (vocab_size + 31) // 32


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool [S, vocab_size]: the bitmask unpacked (tokens past the mask's words are refused)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    unpacked = bits.view(bitmask.shape[0], -1).bool()
    width = unpacked.shape[1]
    if width >= vocab_size:
        return unpacked[:, :vocab_size]
    pad = torch.zeros(bitmask.shape[0], vocab_size - width, dtype=torch.bool, device=bitmask.device)
    return torch.cat([unpacked, pad], dim=1)


def apply_token_mask(logits: torch.Tensor, mask: TokenMask) -> None:
    """Sets the logits of every refused token of the masked rows to -inf, in place."""
    device = logits.device
    bitmask = mask.bitmask.to(device, non_blocking=True)
    allowed = allowed_tokens(bitmask, logits.shape[-1])
    if len(mask.rows) == logits.shape[0] and mask.rows == tuple(range(logits.shape[0])):
        logits.masked_fill_(~allowed, float("-inf"))
        return
    # One bool index-put and one in-place fill: cheaper than gathering the rows out and back.
    refused = torch.zeros(logits.shape, dtype=torch.bool, device=device)
    refused[torch.tensor(mask.rows, dtype=torch.long, device=device)] = ~allowed
    logits.masked_fill_(refused, float("-inf"))
