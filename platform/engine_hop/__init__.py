"""The hop between the gateway and an engine: what both ends must agree on, and the
gateway's engine clients.

- `wire`: the request as an OpenAI completions body and headers, the streamed events
  (full and compact), the cache rules push, and the link's path;
- `refusals`: the one table of an engine's refusals (status, type, code, param);
- `stats_json`: the engine's speculative-decoding and per-tenant KV figures in the
  JSON of GET /internal/stats;
- `adapter_metrics`, `tier_metrics`: the Prometheus series both ends export the same way;
- `eager`: runs a coroutine in the caller until it waits (both ends' link sends).

The clients (the gateway's end):
- `client`: the `EngineClient` protocol, its `EngineSnapshot`, snapshots summed;
- `in_process`: the client of an engine front in this process;
- `remote_client`, `link_client`, `remote_adapters`, `remote_errors`: the client of
  one engine server (over the link or HTTP), its adapter pushes, its refusals read;
- `replica_set`, `routing`: several engine servers and the policy that picks one;
- `replicas`: one state per engine behind a client (the console, /metrics);
- `adapters`: a loaded adapter and the adapter errors; `trace`: the outgoing trace context.

Both services import it (the gateway never imports `engine_server`, and the engine
server never imports the gateway); it imports no service, only the engine. Of the
wire format, only the hop's own modules and the engine server read it.
"""
