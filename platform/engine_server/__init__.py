"""`cloister engine serve`: one model's engine behind an internal HTTP API for gateways."""
