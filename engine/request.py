"""The one request object that crosses the gateway -> engine boundary.

Built once by the caller (the gateway, the offline LLM, a test), checked once in
its constructor, and then handed unchanged through every front: in-process
(`AsyncEngine`), child process (`ProcessEngine`, pickled as is) or remote. The
engine's own limits (vocabulary, context, KV pool) are checked once more, by the
front, against the engine's figures: see `engine.validation.validate_request`.
Nothing after that re-checks a field.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.errors import InvalidRequestError
from engine.sampling_params import SamplingParams

# Bounds of `EngineRequest.priority` (a 32-bit signed integer, as vLLM's is used).
MIN_PRIORITY = -(2**31)
MAX_PRIORITY = 2**31 - 1
# The request classes (issue 42): interactive work first; batch work runs only in the
# capacity interactive work leaves, and is preempted first when interactive work waits.
TRAFFIC_CLASSES = ("interactive", "batch")
# Longest request id, cache domain, fairness key or adapter name taken.
MAX_NAME_LENGTH = 512


def _new_request_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, kw_only=True)
class EngineRequest:
    """One generation request, validated at construction and never changed after.

    `cache_domain` is whose prefix cache the request reads and writes; `fairness_key`
    (the tenant; default: the cache domain) whose share of the scheduler and of the
    waiting slots it uses, and `weight` that share. `cache=False` neither reads nor
    writes the prefix cache. `priority` orders requests of one fairness key under the
    fair policies (lower runs first; it never reorders keys); `prompt` is the text the
    ids came from, for outputs that echo it. `session` is a routing hint only (the
    hash of the client's `user` field, the conversation it continues): a replica
    router may keep a session on one replica; no engine reads it. `traffic_class`
    "batch" marks offline work (OpenAI's `service_tier: "flex"`): admitted only while no
    interactive request waits, its prompt chunks held back while one does, and its
    sequences preempted first for interactive work, which it never preempts.
    """

    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    request_id: str = field(default_factory=_new_request_id)
    cache_domain: str = "default"
    fairness_key: str = ""
    weight: float | None = None
    adapter: str | None = None
    cache: bool = True
    priority: int = 0
    prompt: str | None = None
    session: str | None = None
    traffic_class: str = "interactive"

    def __post_init__(self) -> None:
        # A copy the caller cannot change after the checks (a list would stay shared).
        ids = self.prompt_token_ids
        if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
            raise InvalidRequestError("the prompt must be a list of token ids", param="prompt")
        if not isinstance(ids, tuple):
            object.__setattr__(self, "prompt_token_ids", tuple(ids))
        if not isinstance(self.params, SamplingParams):
            raise InvalidRequestError("sampling params must be a SamplingParams", param="params")
        _check_name(self.request_id, "request_id")
        _check_name(self.cache_domain, "cache_domain")
        if self.fairness_key == "":
            object.__setattr__(self, "fairness_key", self.cache_domain)
        else:
            _check_name(self.fairness_key, "fairness_key")
        if self.adapter is not None:
            _check_name(self.adapter, "adapter")
        weight = self.weight
        if weight is not None and (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not 0 < weight < math.inf
        ):
            raise InvalidRequestError("weight must be a positive finite number", param="weight")
        if not isinstance(self.cache, bool):
            raise InvalidRequestError("cache must be a boolean", param="cache")
        priority = self.priority
        if (
            isinstance(priority, bool)
            or not isinstance(priority, int)
            or not MIN_PRIORITY <= priority <= MAX_PRIORITY
        ):
            raise InvalidRequestError(
                f"priority must be an integer in [{MIN_PRIORITY}, {MAX_PRIORITY}]",
                param="priority",
            )
        if self.prompt is not None and not isinstance(self.prompt, str):
            raise InvalidRequestError("prompt text must be a string", param="prompt")
        if self.session is not None:
            _check_name(self.session, "session")
        if self.traffic_class not in TRAFFIC_CLASSES:
            raise InvalidRequestError(
                f"traffic_class must be one of {', '.join(TRAFFIC_CLASSES)}",
                param="traffic_class",
            )


def _check_name(value: object, param: str) -> None:
    """A non-empty string of printable characters (it lands in logs and metric labels)."""
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{param} must be a non-empty string", param=param)
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidRequestError(
            f"{param} is longer than {MAX_NAME_LENGTH} characters", param=param
        )
    if not value.isprintable():
        raise InvalidRequestError(f"{param} must not contain control characters", param=param)


def check_adapter_name(name: object) -> None:
    """The check an adapter's name passes (the same as a request's `adapter` field)."""
    _check_name(name, "name")
