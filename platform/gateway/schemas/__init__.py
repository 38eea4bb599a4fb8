"""OpenAI-shaped request and response bodies (pydantic)."""
