"""One Cloister server: the settings every service reads, its logging, and how
`cloister serve` assembles gateway, admin service and engine into one app.

Both services import `server.settings`; only the CLI imports `server.wiring`.
"""
