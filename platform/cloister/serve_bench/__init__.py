"""`cloister bench serve`: a serving benchmark against any OpenAI-compatible server.

workload (what to send) -> client (one timed streamed request) -> runner (closed loop at
one concurrency for a fixed duration, after a warm-up) -> report (percentiles, goodput,
the frontier plot).
"""
