"""OpenAI-compatible gateway."""
