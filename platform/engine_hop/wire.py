"""The gateway -> engine hop on the wire: the one request object as an OpenAI body, and back.

A request travels as an OpenAI completions body on token ids, with vLLM's extra
sampling fields, so that Kubernetes inference routers (Gateway API Inference
Extension, llm-d) can read it:

- the cache domain is `cache_salt` (the gateway derives it; a tenant never sets it);
- the fairness key (the tenant) is the `x-llm-d-inference-fairness-id` header;
- the request id is the `x-request-id` header;
- what OpenAI's body has no field for (the fairness weight, caching off, the output
  constraint, the prompt's text) sits in one `cloister` object.

Each streamed chunk is an OpenAI completion chunk whose `cloister` field carries the
engine's event (token ids, logprobs, cached tokens, timings), so the gateway rebuilds
exactly the `StreamEvent` an in-process engine would have given it. A gateway asks for
the compact form instead (`x-cloister-wire: events`): each chunk is then the event
alone, in short keys (`event_to_compact`), about a third of the bytes and of the
encode and decode time; a plain OpenAI client (a router, curl) never sees that form.
Chunks are encoded and decoded with orjson.

A streamed request is admitted or refused before its first token: the engine server
answers a refusal with its error status (engine_hop.refusals), and an admission, in the
compact form, with the 200's status line as soon as the engine took the request, not
with the first chunk (a long prefill must not keep the gateway from answering its
client). Over the link, a gateway that asks for it on the handshake
(`LINK_FEATURES_HEADER: ACCEPTED_FEATURE`) gets an accepted frame
(`{"id": ID, ACCEPTED_KEY: 1}`) as soon as the engine took the request; an older
gateway, which would read the frame as malformed, does not ask and gets none. So a
gateway knows, without a round trip of its own, whether a remote engine admitted a
request, as an in-process submit tells it by returning or raising.

The same body and headers travel over the link (`LINK_PATH`, one WebSocket per gateway;
its frames are described in engine_server.link, its gateway end is engine_hop.link_client).
The gateway writes requests and cache rules (`request_to_wire`, `rules_to_wire`) and
reads events back (`event_from_compact`; `event_from_wire` reads the full form); the
engine server reads them (`request_from_wire`, `rules_from_wire`) and writes events
(`event_to_compact`, `event_to_wire`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import orjson

from engine.errors import InvalidRequestError
from engine.kv_cache.cache_rules import CacheRules, DomainRule
from engine.outputs import (
    CompletionDelta,
    PositionLogprobs,
    RequestMetrics,
    StreamEvent,
    TokenLogprob,
)
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredSpec

FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
REQUEST_ID_HEADER = "x-request-id"
# The gateway's request header for the compact chunks, and its one value.
WIRE_HEADER = "x-cloister-wire"
EVENTS_WIRE = "events"
DONE_CHUNK = b"data: [DONE]\n\n"
# The link's WebSocket route on an engine server (service credential on the handshake).
LINK_PATH = "/internal/link"
# The link handshake's header naming what the gateway reads beyond the original frames,
# and its one feature: the accepted frame, whose key is ACCEPTED_KEY.
LINK_FEATURES_HEADER = "x-cloister-link"
ACCEPTED_FEATURE = "accepted"
ACCEPTED_KEY = "a"
# SamplingParams fields sent under their own (vLLM) names; the rest are special-cased.
_PLAIN_PARAMS = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "max_tokens",
    "min_tokens",
    "ignore_eos",
    "logprobs",
    "skip_special_tokens",
)


class WireFormatError(InvalidRequestError):
    """A hop message is not what the other side sends (a 400 on the engine server)."""

    code = "invalid_engine_request"


def request_to_wire(request: EngineRequest, model: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The body and headers that carry `request` to an engine server serving `model`."""
    params = request.params
    body: dict[str, Any] = {name: getattr(params, name) for name in _PLAIN_PARAMS}
    structured = params.structured
    body.update(
        model=model,
        prompt=list(request.prompt_token_ids),
        stream=True,
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
        logit_bias={str(token): bias for token, bias in params.logit_bias},
        priority=request.priority,
        cache_salt=request.cache_domain,
        cloister={
            "weight": request.weight,
            "cache": request.cache,
            "adapter": request.adapter,
            "prompt_text": request.prompt,
            "structured": None if structured is None else dataclasses.asdict(structured),
            "traffic_class": request.traffic_class,
        },
    )
    headers = {REQUEST_ID_HEADER: request.request_id, FAIRNESS_HEADER: request.fairness_key}
    return body, headers


def _stop_strings(stop: Any) -> tuple[str, ...]:
    """OpenAI's `stop`: one string or a list of them (a plain client may send either; a
    string is one stop, never its characters)."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise WireFormatError("'stop' must be a string or a list of strings", param="stop")
    return tuple(stop)


def request_from_wire(body: Mapping[str, Any], headers: Mapping[str, str]) -> EngineRequest:
    """The request a gateway sent; any malformed field is a `WireFormatError`."""
    extra = body.get("cloister") or {}
    prompt = body.get("prompt")
    if not isinstance(extra, Mapping):
        raise WireFormatError("'cloister' must be an object", param="cloister")
    # bool is an int subclass, and JSON's true is not a token id.
    if not isinstance(prompt, list) or not all(type(t) is int for t in prompt):
        raise WireFormatError("the prompt must be a list of token ids", param="prompt")
    try:
        structured = extra.get("structured")
        params = SamplingParams(
            **{name: body[name] for name in _PLAIN_PARAMS if name in body},
            stop=_stop_strings(body.get("stop")),
            stop_token_ids=tuple(body.get("stop_token_ids") or ()),
            logit_bias=tuple(
                (int(token), float(bias)) for token, bias in (body.get("logit_bias") or {}).items()
            ),
            structured=None if structured is None else StructuredSpec(**structured),
        )
        fairness = headers.get(FAIRNESS_HEADER) or ""
        request_id = headers.get(REQUEST_ID_HEADER)
        return EngineRequest(
            prompt_token_ids=tuple(prompt),
            params=params,
            **({"request_id": request_id} if request_id else {}),
            cache_domain=body.get("cache_salt") or "default",
            fairness_key=fairness,
            weight=extra.get("weight"),
            adapter=extra.get("adapter"),
            cache=extra.get("cache", True),
            priority=body.get("priority", 0),
            prompt=extra.get("prompt_text"),
            traffic_class=extra.get("traffic_class") or "interactive",
        )
    except InvalidRequestError:
        raise
    except (TypeError, ValueError, AttributeError) as exc:
        raise WireFormatError(f"malformed engine request: {exc}") from None


def event_to_wire(event: StreamEvent) -> dict[str, Any]:
    """An event as JSON-ready values, without the prompt (the gateway sent it)."""
    return {
        "deltas": [
            {
                "index": d.index,
                "text": d.text,
                "token_ids": list(d.token_ids),
                "logprobs": None if d.logprobs is None else [_logprobs(p) for p in d.logprobs],
                "finish_reason": d.finish_reason,
            }
            for d in event.deltas
        ],
        "num_cached_tokens": event.num_cached_tokens,
        "finished": event.finished,
        "metrics": None if event.metrics is None else _metrics_dict(event.metrics),
    }


def event_from_wire(
    request_id: str, data: Mapping[str, Any], prompt_token_ids: tuple[int, ...]
) -> StreamEvent:
    """The engine's event, with the prompt the gateway kept."""
    metrics = data.get("metrics")
    return StreamEvent(
        request_id=request_id,
        deltas=tuple(
            CompletionDelta(
                index=int(d["index"]),
                text=str(d["text"]),
                token_ids=tuple(int(t) for t in d["token_ids"]),
                logprobs=(
                    None
                    if d.get("logprobs") is None
                    else tuple(_position(p) for p in d["logprobs"])
                ),
                finish_reason=d.get("finish_reason"),
            )
            for d in data["deltas"]
        ),
        prompt_token_ids=prompt_token_ids,
        num_cached_tokens=int(data["num_cached_tokens"]),
        finished=bool(data["finished"]),
        metrics=None if metrics is None else RequestMetrics(**metrics),
    )


def _metrics_dict(m: RequestMetrics) -> dict[str, Any]:
    # By hand: dataclasses.asdict deep-copies, and costs more than the rest of the chunk.
    return {
        "arrival_time": m.arrival_time,
        "first_scheduled_time": m.first_scheduled_time,
        "first_token_time": m.first_token_time,
        "finished_time": m.finished_time,
        "num_preemptions": m.num_preemptions,
    }


def event_to_compact(event: StreamEvent) -> dict[str, Any]:
    """The event in the compact form: `d` the deltas as [index, text, token ids,
    logprobs, finish reason], `c` the cached tokens, `f` finished, `m` the metrics as
    [arrival, first scheduled, first token, finished, preemptions]; a position's
    logprobs are [chosen, top], each token as [id, logprob, text]."""
    m = event.metrics
    return {
        "d": [
            (
                d.index,
                d.text,
                d.token_ids,
                None if d.logprobs is None else [_compact_position(p) for p in d.logprobs],
                d.finish_reason,
            )
            for d in event.deltas
        ],
        "c": event.num_cached_tokens,
        "f": event.finished,
        "m": None
        if m is None
        else (
            m.arrival_time,
            m.first_scheduled_time,
            m.first_token_time,
            m.finished_time,
            m.num_preemptions,
        ),
    }


def event_from_compact(
    request_id: str, data: Mapping[str, Any], prompt_token_ids: tuple[int, ...]
) -> StreamEvent:
    """The engine's event from its compact form; a malformed one raises ValueError,
    KeyError, IndexError or TypeError."""
    m = data["m"]
    return StreamEvent(
        request_id=request_id,
        deltas=tuple(
            CompletionDelta(
                index,
                text,
                tuple(ids),
                None if lps is None else tuple(_from_compact_position(p) for p in lps),
                finish,
            )
            for index, text, ids, lps, finish in data["d"]
        ),
        prompt_token_ids=prompt_token_ids,
        num_cached_tokens=data["c"],
        finished=data["f"],
        metrics=None if m is None else RequestMetrics(*m),
    )


def _compact_position(p: PositionLogprobs) -> tuple[Any, ...]:
    c = p.chosen
    return ((c.token_id, c.logprob, c.text), [(t.token_id, t.logprob, t.text) for t in p.top])


def _from_compact_position(raw: list[Any]) -> PositionLogprobs:
    chosen, top = raw
    return PositionLogprobs(TokenLogprob(*chosen), tuple(TokenLogprob(*t) for t in top))


def sse_chunk(payload: Any) -> bytes:
    """One server-sent event carrying `payload` as JSON."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _logprobs(p: PositionLogprobs) -> dict[str, Any]:
    return {"chosen": dataclasses.asdict(p.chosen), "top": [dataclasses.asdict(t) for t in p.top]}


def _position(raw: Mapping[str, Any]) -> PositionLogprobs:
    return PositionLogprobs(
        chosen=TokenLogprob(**raw["chosen"]), top=tuple(TokenLogprob(**t) for t in raw["top"])
    )


def rules_to_wire(rules: CacheRules) -> dict[str, Any]:
    """Cache rules as JSON-ready values."""
    return {
        "domains": [[root, dataclasses.asdict(rule)] for root, rule in rules.domains],
        "published": [list(p) for p in rules.published],
    }


def rules_from_wire(data: Mapping[str, Any]) -> CacheRules:
    """The rules a gateway pushed; a malformed push is a `WireFormatError`."""
    try:
        return CacheRules(
            domains=tuple((root, DomainRule(**rule)) for root, rule in data.get("domains", ())),
            published=tuple(tuple(p) for p in data.get("published", ())),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise WireFormatError(f"malformed cache rules: {exc}") from None
