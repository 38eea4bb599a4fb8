"""The admin API's request and response shapes, one module per resource.

Per resource: `*Create` and `*Update` bodies, a `*Public` response (never a hash or a
secret), and a `*Created` response that carries a secret exactly once.
"""
