"""The engine's fronts: what runs an `LLMEngine`'s steps for a server, and how requests
and results cross into and out of its loop.

`AsyncEngine` steps it on a thread of this process and `ProcessEngine` in a child
process; both drive the same loop (`core_loop`), whose reports cross a process boundary
as length-prefixed frames (`frames`). A step's failure is contained to the requests it
touched (`step_isolation`), and an engine is built off the server's thread
(`scratch_thread`).
"""
