"""The bundled SmolLM2 GGUF as a transformers model, read once per test session.

transformers dequantizes the GGUF into fp32 on every `from_pretrained` (about a
minute on two cores); the parity tests share this one read-only copy.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any


@functools.lru_cache(maxsize=1)
def hf_smollm2() -> Any:
    """transformers' fp32 SmolLM2 from the bundled GGUF, in eval mode (do not modify it)."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine.model.loader import default_model_path

    path = Path(default_model_path())
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True
    )
    return model.eval()
