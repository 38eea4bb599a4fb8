"""The floor for bench/gateway_overhead.py: the least any gateway in front of the engine does.

A bare ASGI app on uvicorn (the server `cloister serve` uses) that, per request,
reads and parses the JSON body, makes one Redis round trip (a Lua script that
increments one counter: a fixed-window limiter, the cheapest exact one) and streams the prompt through
the same engine front the gateway uses (the fake fast model in a child process).
It has no authentication, no tokenizing (the prompt's ids are computed once at
start-up), no limits, metrics, tracing or metering.

Whatever latency this adds over calling the engine directly is paid by every
gateway on this machine, however lean; the gateway's own cost is what it adds
above this floor.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio
import uvicorn
from starlette.types import Receive, Scope, Send

from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from server.settings import Settings
from tests.utils.fast_fake_model import fast_fake_front

# One counter per request: the least an exact Redis-backed limiter does.
COUNT_SCRIPT = "return redis.call('INCR', KEYS[1])"
JSON_HEADERS = [(b"content-type", b"application/json")]


class FloorApp:
    """The bare ASGI app; see the module docstring."""

    def __init__(self, settings: Settings, messages: list[dict[str, str]]) -> None:
        self.engine = fast_fake_front(settings)
        tok = self.engine.tokenizer
        self.prompt_ids = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
        self.redis = (
            redis.asyncio.Redis.from_url(settings.redis_url) if settings.redis_url else None
        )
        self.script = self.redis.register_script(COUNT_SCRIPT) if self.redis else None
        self.counter_key = settings.gateway.redis_key_prefix + "floor:requests"
        self.served = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Lifespan (engine start/stop), GET /health and POST /v1/chat/completions."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http" and scope["method"] == "POST":
            await self._chat(receive, send)
        elif scope["type"] == "http":
            await self._respond(send, 200, b'{"status":"ok"}')

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.engine.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.engine.shutdown()
                if self.redis is not None:
                    await self.redis.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _chat(self, receive: Receive, send: Send) -> None:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body: dict[str, Any] = json.loads(b"".join(chunks))
        if self.script is not None:
            await self.script(keys=[self.counter_key])
        params = SamplingParams(max_tokens=int(body["max_tokens"]), temperature=0, ignore_eos=True)
        self.served += 1
        text = []
        stream = self.engine.submit(
            EngineRequest(
                prompt_token_ids=tuple(self.prompt_ids),
                params=params,
                request_id=f"floor-{self.served}",
                cache_domain="t:floor",
            )
        )
        async for event in stream:
            text.extend(d.text for d in event.deltas)
        # The whole shape OpenAI clients parse (a proxy in front of the floor reads it).
        answer = {
            "id": f"chatcmpl-floor-{self.served}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "floor"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(text)},
                    "finish_reason": "length",
                }
            ],
            "usage": {
                "prompt_tokens": len(self.prompt_ids),
                "completion_tokens": params.max_tokens,
                "total_tokens": len(self.prompt_ids) + (params.max_tokens or 0),
            },
        }
        await self._respond(send, 200, json.dumps(answer).encode())

    @staticmethod
    async def _respond(send: Send, status: int, payload: bytes) -> None:
        await send({"type": "http.response.start", "status": status, "headers": JSON_HEADERS})
        await send({"type": "http.response.body", "body": payload})


def serve_floor(messages: list[dict[str, str]]) -> None:
    """Serves the floor app on the host and port of the CLOISTER_* settings."""
    settings = Settings()
    uvicorn.run(
        FloorApp(settings, messages), host=settings.host, port=settings.port, log_config=None
    )
