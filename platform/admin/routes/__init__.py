"""The admin API, one module-level router per resource (mounted under /admin/api/v1 by
admin/router.py, which binds the services)."""
