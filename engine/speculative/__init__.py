"""Speculative decoding: draft tokens proposed per sequence, verified in one forward pass."""
