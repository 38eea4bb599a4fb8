"""The gateway over the real SmolLM2 model (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tenancy.limiter.memory import MemoryLimiter
from tests.utils.live_gateway import start_gateway, stream_chat


@pytest.mark.slow
def test_smollm2_chat_and_stream(tmp_path: Path) -> None:
    from engine.fronts.async_engine import AsyncEngine

    engine = AsyncEngine.from_options(model=None, max_model_len=1024, attention_backend="torch")
    gw, stop = start_gateway(tmp_path, engine=engine, limiter=MemoryLimiter())
    try:
        client = gw.client(gw.tenant("acme"))
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        out = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=16, temperature=0
        )
        assert "Paris" in (out.choices[0].message.content or "")
        chunks, text = stream_chat(client, messages, max_tokens=16)
        assert text == out.choices[0].message.content
        assert chunks[-1].usage is not None
    finally:
        stop()
