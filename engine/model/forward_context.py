"""The per-step context the model's attention layers read (passed explicitly, never global)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.lora.batch import LoraBatch


@dataclass(frozen=True)
class ForwardContext:
    """One step's attention backend, flat-batch metadata and per-layer KV caches."""

    backend: AttentionBackend
    meta: AttentionMetadata
    kv_caches: Sequence[torch.Tensor]  # one [2, blocks, block_size, kv_heads, head_dim] per layer
    lora: LoraBatch | None = None  # the step's adapter rows; None: no row has one
