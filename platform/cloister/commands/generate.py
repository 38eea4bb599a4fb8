"""`cloister generate`: stream a completion for one prompt from the in-process engine."""

from __future__ import annotations

import json
import sys
from typing import cast

import click

from cloister.cli_context import json_option
from engine.request import EngineRequest


@click.command()
@click.argument("prompt")
@click.option(
    "--model", default=None, help="GGUF file or Hugging Face folder (default: bundled SmolLM2)."
)
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", default=0.0, show_default=True, type=float)
@click.option("--top-p", default=1.0, show_default=True, type=float)
@click.option("--seed", default=None, type=int)
@click.option("--chat/--raw", default=True, show_default=True, help="Apply the chat template.")
@click.option(
    "--attention-backend",
    type=click.Choice(["auto", "torch", "cpu", "triton"]),
    default="auto",
    show_default=True,
)
@click.option(
    "--weight-quant",
    type=click.Choice(["auto", "none", "int8", "int4"]),
    default="none",
    show_default=True,
    help="Weight-only int8/int4 linears (auto: the model file's own, e.g. int4 for Q4_1).",
)
@json_option
def generate(
    prompt: str,
    model: str | None,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    chat: bool,
    attention_backend: str,
    weight_quant: str,
    as_json: bool,
) -> None:
    """Streams a completion for PROMPT to standard output (with --json: prints one
    document, {"text", "finish_reason", "prompt_tokens", "completion_tokens"}, at the end)."""
    from engine.config import AttentionBackendName, EngineConfig, ModelConfig
    from engine.errors import EngineError, RequestFailedError
    from engine.llm_engine import LLMEngine
    from engine.model.loader import load_model
    from engine.model.quant import WeightQuantSetting
    from engine.sampling_params import SamplingParams

    try:
        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed
        )
        loaded = load_model(model, dtype=ModelConfig.dtype, device="cpu", progress=True)
        config = EngineConfig(
            model=ModelConfig(
                path=model or "", weight_quant=cast(WeightQuantSetting, weight_quant)
            ),
            attention_backend=cast(AttentionBackendName, attention_backend),
        )
        engine = LLMEngine(config, loaded)
        click.echo(engine.capacity.describe(), err=True)
        tokenizer = engine.tokenizer
        if chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            ids = tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = tokenizer.encode(prompt)
        engine.add_request(EngineRequest(prompt_token_ids=tuple(ids), params=params, prompt=prompt))
        finish = None
        pieces: list[str] = []
        completion_tokens = 0
        while engine.has_unfinished():
            for event in engine.step():
                for delta in event.deltas:
                    pieces.append(delta.text)
                    completion_tokens += len(delta.token_ids)
                    if not as_json:
                        sys.stdout.write(delta.text)
                    finish = delta.finish_reason or finish
                sys.stdout.flush()
            if engine.take_failures():  # the engine logged the cause
                raise RequestFailedError()
        if as_json:
            text = "".join(pieces)
            document = {
                "text": text,
                "finish_reason": finish,
                "prompt_tokens": len(ids),
                "completion_tokens": completion_tokens,
            }
            click.echo(json.dumps(document, sort_keys=True))
            return
        sys.stdout.write("\n")
        click.echo(f"[finish_reason={finish}]", err=True)
    except EngineError as exc:
        raise click.ClickException(str(exc)) from exc


commands: list[click.Command] = [generate]
