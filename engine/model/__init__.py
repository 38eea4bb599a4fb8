"""Llama-family models, their loaders (GGUF, Hugging Face folders) and tokenizers."""
