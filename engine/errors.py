"""Typed engine errors.

The engine raises these; the gateway maps them to HTTP once, at its edge. Every
error that is the caller's fault derives from `InvalidRequestError` and names the
offending parameter, so that it can become a 400 with `param` set.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class for every error the engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    """The request itself is bad; nothing was queued. `param` names the field."""

    code: str = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ContextLengthExceededError(InvalidRequestError):
    """The prompt (plus the tokens asked for) does not fit the model's context."""

    code = "context_length_exceeded"


class RequestTooLargeError(InvalidRequestError):
    """The request could never fit into the whole KV pool, so it would wait forever."""

    code = "request_too_large"


class KVQuotaExceededError(InvalidRequestError):
    """The request (prompt + max_tokens) needs more KV blocks than its tenant's quota."""

    code = "kv_quota_exceeded"


class EngineOverloadedError(EngineError):
    """The waiting queue is full; retry later. Raised at once by `submit`."""

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnsupportedModelError(EngineError):
    """The model file uses an architecture or tensor type the engine cannot run."""


class RequestAbortedError(EngineError):
    """The request was aborted before it finished."""


class EngineDeadError(EngineError):
    """The engine loop stopped after an internal failure; it serves nothing more."""


class RequestFailedError(EngineError):
    """The engine failed this one request after it was queued (a step raised on it).

    The message is the same for every failure, and safe to show a tenant; the cause
    is logged by the engine with the request id, never sent.
    """

    code = "engine_error"
    MESSAGE = "the engine failed to process this request"

    def __init__(self, message: str = MESSAGE) -> None:
        # The message is a parameter only so that pickling (ProcessEngine) rebuilds it.
        super().__init__(message)


class AdapterNotFoundError(InvalidRequestError):
    """The request names an adapter that is not loaded."""

    code = "adapter_not_found"


class InvalidAdapterError(InvalidRequestError):
    """An adapter folder is not a PEFT LoRA adapter this model can run (format, shapes, rank)."""

    code = "invalid_adapter"


class AdapterInUseError(EngineError):
    """The adapter cannot be unloaded: requests still use it (retry when they end)."""

    code = "adapter_in_use"
