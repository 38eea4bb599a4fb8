"""Constrained decoding cost: ITL and throughput of structured vs free decoding, and the
grammar compile times of llguidance and outlines-core on the same schemas.

Decoding: one in-process `LLMEngine`, --concurrency requests at once (the same chat
prompts in both modes, seeded sampling), each run to exactly --max-tokens tokens:

    free        no constraint, ignore_eos
    structured  a JSON schema (an array of at least 1000 user records) that cannot be
                complete before --max-tokens, so both modes decode the same number of
                tokens and their per-token times compare directly

The modes alternate in a mirrored order (free, structured, structured, free, ...) over
--rounds rounds, so slow drift on a busy machine falls on both alike. ITL is per
request (last token time - first token time) / (tokens - 1), pooled p50; throughput
is output tokens / wall time. Also printed: the host time per step spent filling masks.
Goal: ITL p50 overhead under 10%.

Compile: per schema, llguidance (grammar_from_json_schema + LLMatcher + first mask; the
median of --compile-repeats cold compiles, no cache) and outlines-core
(build_regex_from_schema + Index over the vocabulary; one compile, it takes seconds). Each library's
one-off tokenizer/vocabulary build is timed apart. outlines-core's vocabulary is built
from each token's decoded text (byte-level tokens decoded by the tokenizer itself).
The last printed line is one JSON object.

    python bench/structured.py                   # bundled SmolLM2, ~1-2 minutes on 2 cores
    python bench/structured.py --quick --model <tiny model dir>
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from engine.engine_builder import build_config  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.model.loader import load_model  # noqa: E402
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.structured.spec import StructuredSpec  # noqa: E402

GOAL_OVERHEAD = 0.10
USER = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 100000},
        "name": {"type": "string", "maxLength": 16},
        "email": {"type": "string", "maxLength": 32},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["id", "name", "email", "role", "tags"],
    "additionalProperties": False,
}
LONG_SCHEMA = {"type": "array", "items": USER, "minItems": 1000}
COMPILE_SCHEMAS: dict[str, Any] = {
    "user": USER,
    "users_array": {"type": "array", "items": USER, "minItems": 1, "maxItems": 4},
    "nested_defs": {
        "type": "object",
        "$defs": {"Owner": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "properties": {
            "owner": {"$ref": "#/$defs/Owner"},
            "pets": {"type": "array", "items": {"$ref": "#/$defs/Owner"}},
            "kind": {"enum": ["cat", "dog", "fish"]},
        },
        "required": ["owner", "pets", "kind"],
    },
    "wide_100": {
        "type": "object",
        "properties": {f"field_{i}": {"type": "string", "maxLength": 10} for i in range(100)},
        "required": [f"field_{i}" for i in range(100)],
    },
}
TOPICS = ["a bookshop", "a hospital", "a game studio", "a bakery", "a school", "a bank"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2, help="mirrored pairs of the two modes")
    ap.add_argument("--compile-repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: its default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="a short run (tests)")
    return ap.parse_args(argv)


def run_mode(engine: LLMEngine, prompts: list[list[int]], mode: str, max_tokens: int) -> Any:
    """Runs one batch of requests to the end; per request its token times."""
    spec = StructuredSpec("json_schema", json.dumps(LONG_SCHEMA)) if mode == "structured" else None
    ids = []
    for i, prompt in enumerate(prompts):
        params = SamplingParams(
            temperature=0.8, seed=i, max_tokens=max_tokens, ignore_eos=True, structured=spec
        )
        ids.append(engine.add_request(EngineRequest(prompt_token_ids=tuple(prompt), params=params)))
    times: dict[str, list[float]] = {r: [] for r in ids}
    counts: dict[str, int] = dict.fromkeys(ids, 0)
    start = time.perf_counter()
    while engine.has_unfinished():
        events = engine.step()
        now = time.perf_counter()
        for event in events:
            tokens = sum(len(d.token_ids) for d in event.deltas)
            if tokens:
                times[event.request_id].append(now)
                counts[event.request_id] += tokens
    wall = time.perf_counter() - start
    itls = [(t[-1] - t[0]) / (len(t) - 1) for t in times.values() if len(t) > 1]
    return {"itls": itls, "tokens": sum(counts.values()), "wall_s": wall}


def _count_mask_steps(engine: LLMEngine, steps: list[int]) -> None:
    """Wraps the runner's mask start to count the steps that have structured rows."""
    table = engine.runner.matchers
    real: Callable[..., Any] = table.start_masks

    def start(seqs: Any) -> Any:
        pending = real(seqs)
        if pending is not None:
            steps.append(1)
        return pending

    table.start_masks = start  # type: ignore[method-assign]


def decode_bench(args: argparse.Namespace) -> dict[str, Any]:
    """ITL and throughput, free vs structured."""
    loaded = load_model(args.model, dtype=torch.float32, device=args.device)
    tok = loaded.tokenizer
    prompts = []
    for i in range(args.concurrency):
        topic = TOPICS[i % len(TOPICS)]
        text = tok.apply_chat_template(
            [{"role": "user", "content": f"List the users of {topic} as JSON (#{i})."}]
        )
        prompts.append(tok.encode(text, add_special_tokens=False))
    longest = max(len(p) for p in prompts) + args.max_tokens
    config = build_config(
        None,
        max_model_len=longest + 16,
        num_blocks=args.concurrency * (longest // 16 + 2) + 8,
        max_num_seqs=args.concurrency,
        device=args.device,
    )
    engine = LLMEngine(config, loaded)
    engine.grammars.compile(StructuredSpec("json_schema", json.dumps(LONG_SCHEMA)))
    mask_steps: list[int] = []
    _count_mask_steps(engine, mask_steps)
    table = engine.runner.matchers
    run_mode(engine, prompts, "free", 4)  # warm-up
    run_mode(engine, prompts, "structured", 4)
    plan = [m for _ in range(args.rounds) for m in ("free", "structured", "structured", "free")]
    plan = plan[: 2 * args.rounds]
    results: dict[str, list[Any]] = {"free": [], "structured": []}
    structured_steps = 0
    fill_s = 0.0  # host time of the structured runs' mask fills (worker threads included)
    for mode in plan:
        steps_before, fill_before = len(mask_steps), table.fill_s
        results[mode].append(run_mode(engine, prompts, mode, args.max_tokens))
        if mode == "structured":
            structured_steps += len(mask_steps) - steps_before
            fill_s += table.fill_s - fill_before
    out: dict[str, Any] = {"model": loaded.name, "device": args.device}
    for mode, runs in results.items():
        itls = [x for r in runs for x in r["itls"]]
        tokens = sum(r["tokens"] for r in runs)
        wall = sum(r["wall_s"] for r in runs)
        out[mode] = {
            "itl_p50_ms": round(statistics.median(itls) * 1000, 3),
            "itl_mean_ms": round(statistics.fmean(itls) * 1000, 3),
            "throughput_tok_s": round(tokens / wall, 1),
            "tokens": tokens,
        }
    free, structured = out["free"], out["structured"]
    out["itl_p50_overhead"] = round(structured["itl_p50_ms"] / free["itl_p50_ms"] - 1, 4)
    out["throughput_overhead"] = round(
        1 - structured["throughput_tok_s"] / free["throughput_tok_s"], 4
    )
    out["mask_fill_ms_per_step"] = round(1000 * fill_s / max(1, structured_steps), 3)
    out["goal_met"] = out["itl_p50_overhead"] < GOAL_OVERHEAD
    engine.grammars.shutdown()
    out["_tokenizer"] = tok
    out["_vocab_size"] = loaded.arch.vocab_size
    return out


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def compile_bench(
    hf: Any, vocab_size: int, eos: int, repeats: int, names: Sequence[str]
) -> dict[str, Any]:
    """Cold compile times of each schema in both libraries, in milliseconds."""
    import llguidance
    import llguidance.hf
    import llguidance.torch
    import outlines_core
    from outlines_core.json_schema import build_regex_from_schema

    t = time.perf_counter()
    ll_tok = llguidance.hf.from_tokenizer(hf, n_vocab=vocab_size, eos_token=eos)
    ll_tok_s = time.perf_counter() - t
    t = time.perf_counter()
    tokens: dict[str, list[int]] = {}
    for token, token_id in hf.get_vocab().items():
        if token_id != eos:
            text = hf.convert_tokens_to_string([token])
            tokens.setdefault(text, []).append(token_id)
    vocabulary = outlines_core.Vocabulary(eos, tokens)
    oc_vocab_s = time.perf_counter() - t
    out: dict[str, Any] = {
        "llguidance_tokenizer_ms": round(ll_tok_s * 1000, 1),
        "outlines_vocabulary_ms": round(oc_vocab_s * 1000, 1),
        "schemas": {},
    }
    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab_size)
    for name in names:
        text = json.dumps(COMPILE_SCHEMAS[name])

        def llg(text: str = text) -> None:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(text)
            matcher = llguidance.LLMatcher(ll_tok, grammar, log_level=0)
            assert not matcher.is_error(), matcher.get_error()
            llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)

        row: dict[str, Any] = {"llguidance_ms": round(_median_time(llg, repeats) * 1000, 2)}
        try:

            def outlines(text: str = text) -> None:
                outlines_core.Index(build_regex_from_schema(text), vocabulary)

            # Seconds each on a small CPU: one sample shows the order of magnitude.
            row["outlines_core_ms"] = round(_median_time(outlines, 1) * 1000, 2)
        except Exception as exc:  # outlines-core refuses some schemas: say so
            row["outlines_core_ms"] = None
            row["outlines_core_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        out["schemas"][name] = row
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Runs both parts, prints the figures and the JSON line; returns the JSON."""
    args = parse_args(argv)
    if args.quick:
        args.concurrency, args.max_tokens, args.rounds, args.compile_repeats = 4, 8, 1, 1
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    decode = decode_bench(args)
    tok = decode.pop("_tokenizer")
    vocab_size = int(decode.pop("_vocab_size"))
    for mode in ("free", "structured"):
        m = decode[mode]
        print(
            f"{mode:>10}: ITL p50 {m['itl_p50_ms']:.2f} ms (mean {m['itl_mean_ms']:.2f}), "
            f"{m['throughput_tok_s']:.1f} tok/s over {m['tokens']} tokens",
            flush=True,
        )
    print(
        f"structured/free: ITL p50 {decode['itl_p50_overhead']:+.1%}, throughput "
        f"{-decode['throughput_overhead']:+.1%}; masks {decode['mask_fill_ms_per_step']:.3f} ms "
        f"per step (goal: ITL overhead < {GOAL_OVERHEAD:.0%}: "
        f"{'met' if decode['goal_met'] else 'NOT met'})",
        flush=True,
    )
    eos = min(tok.eos_token_ids)
    # The quick run skips the schemas outlines-core takes seconds over.
    names = ("user", "nested_defs") if args.quick else tuple(COMPILE_SCHEMAS)
    compiled = compile_bench(tok.hf, vocab_size, eos, args.compile_repeats, names)
    print(
        f"one-off: llguidance tokenizer {compiled['llguidance_tokenizer_ms']} ms, "
        f"outlines-core vocabulary {compiled['outlines_vocabulary_ms']} ms"
    )
    for name, row in compiled["schemas"].items():
        oc = row["outlines_core_ms"]
        print(
            f"compile {name:>12}: llguidance {row['llguidance_ms']:.2f} ms, outlines-core "
            f"{'refused' if oc is None else f'{oc:.2f} ms'}"
        )
    summary = {
        "bench": "structured",
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        **decode,
        "compile": compiled,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
