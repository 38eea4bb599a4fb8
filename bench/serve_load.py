"""A small serving benchmark client (stdlib only): the GPU check's fallback to SGLang's.

`--concurrency` threads each send streamed greedy `/v1/completions` requests of random
token ids (`--input-len` ids, at most `--output-len` tokens) until `--num-prompts` are
done. It prints one JSON line with the figures SGLang's bench_serving gives: request
and token throughput, TTFT, inter-token latency (ITL) and time per output token
(TPOT), mean / p50 / p99. Token counts are the server's (`usage`), so an output that
ended at an EOS counts what it had; `--eos-bias` biases the EOS ids away instead.

    python bench/serve_load.py --base-url http://127.0.0.1:8123 --model bench \
        --api-key sk-... [--num-prompts 64] [--concurrency 16] [--json-out F]

No dependency beyond the standard library: the GPU machine has no aiohttp.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# SmolLM2's <|endoftext|> and <|im_end|>: biased away so outputs have their full length.
EOS_BIAS = {"0": -100, "2": -100}


@dataclass
class RequestResult:
    """One request's timings (seconds) and token counts."""

    ok: bool
    error: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0


def stream_completion(
    url: urllib.parse.SplitResult, body: dict[str, Any], key: str
) -> RequestResult:
    """Sends one streamed completion and times every chunk that carries text."""
    conn_cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(url.hostname or "127.0.0.1", url.port, timeout=600)
    start = time.perf_counter()
    try:
        conn.request(
            "POST",
            "/v1/completions",
            json.dumps(body),
            {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            return RequestResult(False, f"HTTP {resp.status}: {resp.read()[:300]!r}")
        result = RequestResult(True)
        last = start
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            usage = chunk.get("usage")
            if usage:
                result.output_tokens = int(usage.get("completion_tokens", 0))
                result.prompt_tokens = int(usage.get("prompt_tokens", 0))
            choices = chunk.get("choices") or []
            if choices and choices[0].get("text"):
                now = time.perf_counter()
                if result.ttft == 0.0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
        result.latency = time.perf_counter() - start
        return result
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return RequestResult(False, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def _stats(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    """mean / p50 / p99 in ms (or whatever `scale` makes of seconds)."""
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {
        "mean": statistics.fmean(values) * scale,
        "p50": statistics.median(values) * scale,
        "p99": p99 * scale,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the closed loop and returns the figures."""
    url = urllib.parse.urlsplit(args.base_url)
    rng = random.Random(args.seed)
    prompts = [
        [rng.randrange(3, args.vocab) for _ in range(args.input_len)]
        for _ in range(args.num_prompts)
    ]
    results: list[RequestResult] = []
    lock = threading.Lock()
    todo = iter(prompts)

    def worker() -> None:
        while True:
            with lock:
                prompt = next(todo, None)
            if prompt is None:
                return
            body = {
                "model": args.model,
                "prompt": prompt,
                "max_tokens": args.output_len,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if args.eos_bias:
                body["logit_bias"] = EOS_BIAS
            res = stream_completion(url, body, args.api_key)
            with lock:
                results.append(res)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {
        "client": "bench/serve_load.py",
        "num_prompts": args.num_prompts,
        "concurrency": args.concurrency,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "eos_bias": args.eos_bias,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "first_error": next((r.error for r in results if not r.ok), ""),
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "input_throughput": in_tokens / duration,
        "output_throughput": out_tokens / duration,
        "total_output_tokens": out_tokens,
        "ttft_ms": _stats([r.ttft for r in ok]),
        "itl_ms": _stats([x for r in ok for x in r.itl]),
        "tpot_ms": _stats(tpot),
        "e2e_latency_ms": _stats([r.latency for r in ok]),
    }


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eos-bias", action="store_true", help="bias the EOS ids away")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    figures = run(args)
    line = json.dumps(figures, sort_keys=True)
    if args.json_out:
        args.json_out.write_text(line + "\n")
    print(line)
    raise SystemExit(0 if figures["completed"] and not figures["failed"] else 1)


if __name__ == "__main__":
    main()
