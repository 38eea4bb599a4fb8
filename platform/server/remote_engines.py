"""The gateway's engines when they run elsewhere: `--engine-urls` to engine clients.

One URL is one `RemoteEngineClient`; several (or a `dns+http://` name, whose
addresses come and go) make a `ReplicaSetClient`, which routes each request to one
replica (gateway.routing). The gateway tokenizes with the model's own tokenizer,
read from the same model file or folder the engines serve (no weights are loaded).
"""

from __future__ import annotations

from typing import Any

from server.settings import Settings

# How long the gateway waits at start-up for an engine server that is still loading.
CONNECT_WAIT_S = 120.0


class RemoteEngineConfigError(ValueError):
    """`--engine-urls` cannot be served as configured."""


def remote_engine_clients(settings: Settings) -> dict[str, Any]:
    """model name -> the engine client over `settings.engine_urls`."""
    from engine.model.loader import default_model_path
    from engine.model.tokenizer import load_tokenizer
    from gateway.remote_engine import RemoteEngineClient, fetch_info
    from gateway.replica_set import ReplicaSetClient, expand_urls

    specs = settings.served_models
    if len(specs) != 1:
        raise RemoteEngineConfigError("with --engine-urls, the gateway serves one model")
    spec = specs[0]
    token = None if settings.service_token is None else settings.service_token.get_secret_value()
    tokenizer = load_tokenizer(spec.path or default_model_path())
    urls = settings.engine_urls
    if len(urls) == 1 and not urls[0].startswith("dns+"):
        info = fetch_info(urls[0], token, wait_s=CONNECT_WAIT_S)
        _check_model(info.model_name, spec.name, urls[0])
        client: Any = RemoteEngineClient(
            urls[0], token=token, tokenizer=tokenizer, info=info, model_name=spec.name
        )
        return {spec.name: client}
    replicas = ReplicaSetClient(
        urls,
        token=token,
        tokenizer=tokenizer,
        model_name=spec.name,
        resolve=expand_urls,
        connect_wait_s=CONNECT_WAIT_S,
    )
    return {spec.name: replicas}


def _check_model(served: str, expected: str, url: str) -> None:
    if served != expected:
        raise RemoteEngineConfigError(
            f"the engine at {url} serves {served!r}, but the gateway serves {expected!r}"
        )
