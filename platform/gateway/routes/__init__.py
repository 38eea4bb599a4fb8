"""HTTP routes, one resource per module."""
