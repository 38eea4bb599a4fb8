"""The model dimensions the GPU benchmarks build random-weight models from (stdlib only:
`bench/gpu_decode.py` imports it on the GPU machine before anything heavy)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """The dimensions a benchmark needs of a Llama-family model (real published shapes)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    # What a written model folder needs besides (bench/serve_model.py).
    tie: bool = True
    rope_theta: float = 10000.0
