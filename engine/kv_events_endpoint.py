"""The address a KV events publisher (engine/kv_events_publisher.py) sends to: checked
when the settings are read, without importing ZeroMQ."""

from __future__ import annotations

import re

# tcp://host:port (host may be *, a name, IPv4, or [IPv6]) or ipc://path.
ENDPOINT_PATTERN = re.compile(r"^(tcp://(\*|[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:]+\]):\d{1,5}|ipc://.+)$")


class KVEventsEndpointError(ValueError):
    """The endpoint is not a ZeroMQ tcp:// or ipc:// address."""


def check_endpoint(endpoint: str) -> str:
    """`endpoint` when it is a tcp://host:port or ipc://path address, else the error."""
    if not ENDPOINT_PATTERN.match(endpoint):
        raise KVEventsEndpointError(
            f"the KV events endpoint {endpoint!r} must be tcp://host:port "
            "(tcp://*:port to bind) or ipc://path"
        )
    port = endpoint.rsplit(":", 1)[1] if endpoint.startswith("tcp://") else None
    if port is not None and not 0 < int(port) < 65536:
        raise KVEventsEndpointError(f"the KV events endpoint's port {port} is out of range")
    return endpoint


def binds(endpoint: str) -> bool:
    """Whether the publisher binds `endpoint` (else it connects to it)."""
    return endpoint.startswith("ipc://") or endpoint.startswith("tcp://*:")
