"""One access line per API request, from `RequestLifecycle.close`.

It names the request, its tenant and key (by id: never the secret), its model, its
status, its tokens and its timing. Lines go to the `cloister.access` logger, so an
operator can route or silence them apart from the rest.
"""

from __future__ import annotations

import logging

from tenancy.principal import Principal

logger = logging.getLogger("cloister.access")


def log_access(
    *,
    request_id: str,
    principal: Principal | None,
    model: str,
    status: int,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    ttft_s: float | None,
    latency_s: float,
    finish_reason: str | None,
) -> None:
    """Logs the access line of one finished request (INFO; a 5xx is a WARNING)."""
    logger.log(
        logging.WARNING if status >= 500 else logging.INFO,
        "request done",
        extra={
            "request_id": request_id,
            "tenant": principal.tenant_name if principal else None,
            "tenant_id": principal.tenant_id if principal else None,
            "key_id": principal.key_id if principal else None,
            "model": model or None,
            "status": status,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": cached_tokens,
            "ttft_s": None if ttft_s is None else round(ttft_s, 4),
            "latency_s": round(latency_s, 4),
            "finish_reason": finish_reason,
        },
    )
