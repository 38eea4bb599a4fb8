"""Admin service."""
