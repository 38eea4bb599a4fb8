"""The one request skeleton of the generation routes (chat, completions, responses).

    authenticate (key, body, model) -> vet -> prepare on the model (prompt, admit,
    submit; again on a fallback model) -> stream or collect -> close -> respond

A route supplies what differs (`GenerationRoute`): its body schema, its checks, how it
builds its prompt and submits it, and how it renders the engine's events, streamed or
collected. Everything else, and the order of the steps, is here once: the request is
settled with its error's status whatever step fails, a stream is settled when it ends
or its client leaves, a collected response once its choices are in (before rendering).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from gateway.body import parse_body
from gateway.generation import (
    ChoiceState,
    Submitted,
    collect,
    settled_on_error,
    stream_response,
    submit_with_fallback,
)
from gateway.lifecycle import Authenticated, RequestLifecycle
from gateway.schemas.common import SamplingFields
from gateway.schemas.responses import ResponseCreateRequest
from gateway.state import app_state
from server.request_ids import request_ids_of

Body = TypeVar("Body", bound=SamplingFields | ResponseCreateRequest)
Vetted = TypeVar("Vetted")  # what a route knows once the request passed its checks
Prepared = TypeVar("Prepared")  # what a route derived from the model it submitted to


@dataclass(frozen=True)
class Generation(Generic[Vetted, Prepared]):
    """One request the engine took, as its route renders it."""

    life: RequestLifecycle
    call: Authenticated  # the model it runs on (a fallback's, if it moved)
    vetted: Vetted
    prepared: Prepared
    submitted: Submitted


class GenerationRoute(ABC, Generic[Body, Vetted, Prepared]):
    """What one generation route supplies to the skeleton (`serve`)."""

    id_prefix: ClassVar[str]  # of the request's id ("chatcmpl", "cmpl", "resp")
    body_type: type[Body]

    def lifecycle(self, request: Request) -> RequestLifecycle:
        """The request's lifecycle, its id drawn with `id_prefix`."""
        return RequestLifecycle(
            app_state(request),
            id_prefix=self.id_prefix,
            headers=request.headers,
            ids=request_ids_of(request),
        )

    @abstractmethod
    async def vet(self, life: RequestLifecycle, call: Authenticated, body: Body) -> Vetted:
        """The route's checks of the body, once the caller may use its model: run once."""

    @abstractmethod
    async def prepare(
        self, life: RequestLifecycle, call: Authenticated, vetted: Vetted
    ) -> tuple[Prepared, Submitted]:
        """The steps that depend on `call`'s model (its chat template and tokenizer):
        the prompt, then `gateway.generation.admit_and_submit`. Run again on a fallback
        model (`gateway.generation.submit_with_fallback`)."""

    @abstractmethod
    def stream(self, run: Generation[Vetted, Prepared]) -> AsyncIterator[bytes]:
        """The streamed response's chunks (it sets `life.completed` once all went out)."""

    @abstractmethod
    async def respond(
        self, run: Generation[Vetted, Prepared], choices: list[ChoiceState]
    ) -> Response:
        """The collected response, once the request is closed (its usage recorded)."""


async def authenticate(
    life: RequestLifecycle, request: Request, schema: type[Body]
) -> tuple[Authenticated, Body]:
    """The caller, with the model its body names; and the body. A bad key is refused
    before the body is read, a bad body before its model is looked up."""
    principal = await life.caller(request)
    body = await parse_body(request, schema)
    return life.resolve_model(principal, body.model), body


async def serve(route: GenerationRoute[Body, Vetted, Prepared], request: Request) -> Response:
    """Runs one generation request through `route`; see the module docstring."""
    life = route.lifecycle(request)
    async with settled_on_error(life):
        call, body = await authenticate(life, request, route.body_type)
        vetted = await route.vet(life, call, body)

        async def prepare(on: Authenticated) -> tuple[Prepared, Submitted]:
            return await route.prepare(life, on, vetted)

        call, (prepared, submitted) = await submit_with_fallback(life, call, prepare)
        run = Generation(life, call, vetted, prepared, submitted)
        if body.stream:
            return stream_response(life, route.stream(run), submitted)
        choices = await collect(life, submitted, request)
    await life.close(200)
    return await route.respond(run, choices)
