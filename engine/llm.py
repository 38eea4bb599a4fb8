"""The offline API, in the shape Python users know from vLLM: `LLM(...).generate(...)`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from tqdm import tqdm

from engine.engine_builder import build_config
from engine.errors import InvalidRequestError
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams

Prompt = str | Sequence[int]


class LLM:
    """Loads a model once and runs batches of prompts through the continuous-batching engine.

    `LLM()` serves the bundled SmolLM2-135M-Instruct; `LLM(model=path)` a GGUF file or
    a Hugging Face folder. Keyword options are the fields of the engine's config
    dataclasses (block_size, kv_cache_bytes, max_num_batched_tokens, ...).
    """

    def __init__(self, model: str | None = None, **options: Any) -> None:
        self.engine = LLMEngine(build_config(model, **options), keep_finished=True)
        self.tokenizer = self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        cache_domain: str = "default",
        adapter: str | None = None,
        use_cache: bool = True,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generates for every prompt (text or token ids); outputs come back in prompt order."""
        batch = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(batch))
        ids: list[str] = []
        try:
            for prompt, sp in zip(batch, params, strict=True):
                if isinstance(prompt, str):
                    token_ids = self.tokenizer.encode(prompt)
                    text: str | None = prompt
                else:
                    token_ids, text = list(prompt), None
                ids.append(
                    self.engine.add_request(
                        EngineRequest(
                            prompt_token_ids=tuple(token_ids),
                            params=sp,
                            cache_domain=cache_domain,
                            adapter=adapter,
                            cache=use_cache,
                            prompt=text,
                        )
                    )
                )
            self._run(len(ids), use_tqdm)
        except BaseException:
            for request_id in ids:
                self.engine.abort(request_id)
                self.engine.finished.pop(request_id, None)
            raise
        return [self.engine.finished.pop(i).to_output() for i in ids]

    def chat(
        self,
        messages: Sequence[dict[str, str]] | Sequence[Sequence[dict[str, str]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        **kwargs: Any,
    ) -> list[RequestOutput]:
        """Applies the model's chat template to each conversation, then generates."""
        if not messages:
            raise InvalidRequestError("messages is empty", param="messages")
        conversations = cast(
            "Sequence[Sequence[dict[str, str]]]",
            [messages] if isinstance(messages[0], dict) else messages,
        )
        prompts: list[list[int]] = []
        for conversation in conversations:
            if not conversation:
                raise InvalidRequestError("a conversation has no messages", param="messages")
            text = self.tokenizer.apply_chat_template([dict(m) for m in conversation])
            prompts.append(self.tokenizer.encode(text, add_special_tokens=False))
        return self.generate(prompts, sampling_params, **kwargs)

    def _run(self, total: int, use_tqdm: bool) -> None:
        bar = tqdm(total=total, desc="generating", unit="req", disable=not use_tqdm)
        with bar:
            while self.engine.has_unfinished():
                events = self.engine.step()
                failures = self.engine.take_failures()
                if failures:
                    # Offline, the caller asked for all of them: the first cause is the answer.
                    raise failures[0][1]
                bar.update(sum(1 for e in events if e.finished))


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [cast("list[int]", items)]  # a single token-id prompt
    return cast("list[Prompt]", items)


def _as_params_list(
    params: SamplingParams | Sequence[SamplingParams] | None, count: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    items = list(params)
    if len(items) != count:
        raise InvalidRequestError(
            f"got {len(items)} sampling params for {count} prompts", param="sampling_params"
        )
    return items
