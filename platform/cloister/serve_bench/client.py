"""One timed, streamed `/v1/completions` request over the standard library's HTTP client.

Every server compared (Cloister, vLLM, SGLang, llama.cpp's server) takes a prompt as a
list of token ids and streams SSE chunks; the arrival time of each chunk that carries
text is recorded. Token counts come from the server's `usage` when it sends one
(`stream_options.include_usage`), else from the number of text chunks.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

# One chunk line is a few hundred bytes; a server that sends more is not speaking SSE.
MAX_LINE_BYTES = 1 << 20


@dataclass
class Timing:
    """What one request did: when its text arrived and how many tokens it counted."""

    ok: bool
    error: str = ""
    start: float = 0.0  # time.perf_counter() when the request was sent
    chunk_times: list[float] = field(default_factory=list)  # text-bearing chunks
    end: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    @property
    def ttft(self) -> float:
        """Seconds to the first text."""
        return self.chunk_times[0] - self.start if self.chunk_times else 0.0

    @property
    def itl(self) -> list[float]:
        """Gaps between consecutive text chunks, seconds."""
        times = self.chunk_times
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    @property
    def latency(self) -> float:
        """Seconds from sending to the end of the stream."""
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (None for one-token outputs)."""
        if self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


class CompletionClient:
    """Sends streamed completions to one server with one API key per tenant."""

    def __init__(self, base_url: str, model: str, api_keys: list[str], timeout_s: float) -> None:
        url = urllib.parse.urlsplit(base_url.rstrip("/"))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"the base URL must be http(s)://host[:port], got {base_url!r}")
        self._url, self._model, self._keys, self._timeout = url, model, api_keys, timeout_s
        # A base URL may or may not end in /v1; the path is the same either way.
        prefix = url.path.removesuffix("/v1")
        self._path = f"{prefix}/v1/completions"

    def send(self, tenant: int, prompt: tuple[int, ...], max_tokens: int, **extra: Any) -> Timing:
        """Sends one greedy streamed request and times it; failures come back as `ok=False`."""
        body = {
            "model": self._model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **extra,
        }
        headers = {"Content-Type": "application/json"}
        if self._keys:
            headers["Authorization"] = f"Bearer {self._keys[tenant % len(self._keys)]}"
        cls = (
            http.client.HTTPSConnection
            if self._url.scheme == "https"
            else http.client.HTTPConnection
        )
        conn = cls(self._url.hostname or "127.0.0.1", self._url.port, timeout=self._timeout)
        timing = Timing(ok=False, start=time.perf_counter())
        try:
            conn.request("POST", self._path, json.dumps(body), headers)
            response = conn.getresponse()
            if response.status != 200:
                timing.error = f"HTTP {response.status}: {response.read(300)!r}"
                return timing
            self._read_stream(response, timing)
            timing.ok = True
        except (OSError, http.client.HTTPException, ValueError) as exc:
            timing.error = f"{type(exc).__name__}: {exc}"
        finally:
            timing.end = time.perf_counter()
            conn.close()
        return timing

    @staticmethod
    def _read_stream(response: http.client.HTTPResponse, timing: Timing) -> None:
        text_chunks = 0
        while True:
            line = response.readline(MAX_LINE_BYTES)
            if not line:
                break
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise ValueError(f"error in stream: {str(chunk['error'])[:300]}")
            choices = chunk.get("choices") or []
            if choices and (choices[0].get("text") or choices[0].get("delta", {}).get("content")):
                timing.chunk_times.append(time.perf_counter())
                text_chunks += 1
            usage = chunk.get("usage")
            if usage:
                timing.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                timing.output_tokens = int(usage.get("completion_tokens") or 0)
                details = usage.get("prompt_tokens_details") or {}
                timing.cached_tokens = int(details.get("cached_tokens") or 0)
        if timing.output_tokens == 0:
            timing.output_tokens = text_chunks
