"""The gateway's engines when they run elsewhere: `--engine-urls` to engine clients.

Each served model has its URLs (NAME=URL entries; plain URLs when one model is
served). One URL is one `RemoteEngineClient`; several (or a `dns+http://` name, whose
addresses come and go) make a `ReplicaSetClient`, which routes each request to one
replica (engine_hop.routing). The gateway tokenizes with the model's own tokenizer,
read from the same model file or folder the engines serve (no weights are loaded).
"""

from __future__ import annotations

from typing import Any

from server.settings import Settings, engine_url_groups

# How long the gateway waits at start-up for an engine server that is still loading.
CONNECT_WAIT_S = 120.0


class RemoteEngineConfigError(ValueError):
    """`--engine-urls` cannot be served as configured."""


def remote_engine_clients(settings: Settings) -> dict[str, Any]:
    """model name -> the engine client over its `settings.gateway.engine_urls` (NAME=URL entries
    with several models; plain URLs with one)."""
    from engine.model.loader import default_model_path
    from engine.model.tokenizer import load_tokenizer
    from engine_hop.remote_client import RemoteEngineClient, fetch_info
    from engine_hop.replica_set import ReplicaSetClient, expand_urls

    specs = settings.served_models
    token = None if settings.service_token is None else settings.service_token.get_secret_value()
    try:
        groups = engine_url_groups(settings.gateway.engine_urls, tuple(s.name for s in specs))
    except ValueError as exc:
        raise RemoteEngineConfigError(str(exc)) from None
    clients: dict[str, Any] = {}
    for spec in specs:
        tokenizer = load_tokenizer(spec.path or default_model_path())
        urls = groups[spec.name]
        if len(urls) == 1 and not urls[0].startswith("dns+"):
            info = fetch_info(urls[0], token, wait_s=CONNECT_WAIT_S)
            _check_model(info.model_name, spec.name, urls[0])
            clients[spec.name] = RemoteEngineClient(
                urls[0],
                token=token,
                tokenizer=tokenizer,
                info=info,
                model_name=spec.name,
                transport=settings.gateway.engine_transport,
                request_timeout_s=settings.gateway.engine_read_timeout_s,
            )
            continue
        clients[spec.name] = ReplicaSetClient(
            urls,
            token=token,
            tokenizer=tokenizer,
            model_name=spec.name,
            resolve=expand_urls,
            policy=settings.gateway.router_policy,
            connect_wait_s=CONNECT_WAIT_S,
            transport=settings.gateway.engine_transport,
            request_timeout_s=settings.gateway.engine_read_timeout_s,
        )
    return clients


def _check_model(served: str, expected: str, url: str) -> None:
    if served != expected:
        raise RemoteEngineConfigError(
            f"the engine at {url} serves {served!r}, but the gateway serves {expected!r}"
        )
