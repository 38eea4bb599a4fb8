"""The base floor both services stand on: the settings every service reads, request ids,
telemetry, logging and the API documents' helpers. It imports no service; how
`cloister serve` assembles the services is the assembly floor's (`assembly`).
"""
