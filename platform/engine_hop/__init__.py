"""The hop between the gateway and an engine server: what both ends must agree on.

- `wire`: the request as an OpenAI completions body and headers, the streamed events
  (full and compact), the cache rules push, and the link's path;
- `refusals`: the one table of an engine's refusals (status, type, code, param);
- `stats_json`: the engine's speculative-decoding and per-tenant KV figures in the
  JSON of GET /internal/stats;
- `adapter_metrics`, `tier_metrics`: the Prometheus series both ends export the same way;
- `eager`: runs a coroutine in the caller until it waits (both ends' link sends).

Both services import it (the gateway never imports `engine_server`, and the engine
server never imports the gateway); it imports no service, only the engine.
"""
