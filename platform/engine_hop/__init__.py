"""The hop between the gateway and an engine server: what both ends must agree on.

Both services import it (the gateway never imports `engine_server`, and the engine
server never imports the gateway); it imports only the engine.
"""
