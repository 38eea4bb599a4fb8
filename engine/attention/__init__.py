"""Attention over the paged KV cache, behind one backend interface."""

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.attention.select import get_attention_backend

__all__ = ["AttentionBackend", "AttentionMetadata", "get_attention_backend"]
